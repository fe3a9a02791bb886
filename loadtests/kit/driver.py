"""One `thaw loadtest` run: ready the deployment, sample its machines, run the tool, do
the scenario's action mid-run, undo what was changed, write the report."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from loadtests.kit import hostkill
from loadtests.kit.plot import plot
from loadtests.kit.report import (
    Event,
    read_export,
    read_points,
    report_markdown,
    summarize,
    summary_table,
)
from loadtests.kit.sampler import MachineSampler
from loadtests.kit.scenarios import SCENARIOS, Deployment, merged
from loadtests.kit.tools import run_tool, tool_env, tool_run
from thaw.client import ApiClient
from thaw.cmdbase import api_url, cafile_from, settings, token_from

BURST_DEADLINE_S = 240.0
SETTLE_MAX_S = 60.0


class LoadTest:
    def __init__(self, args: argparse.Namespace, command: str) -> None:
        self.args = args
        self.command = command  # how the run was asked for, for the report
        self.scenario = SCENARIOS[args.scenario]
        stamp = time.strftime("%Y%m%d-%H%M%S")
        self.report: Path = args.report or Path(".thaw") / "loadtests" / f"{args.scenario}-{stamp}"
        api = api_url(args.api)
        self.api = ApiClient(api, token_from(args.token, api), timeout_s=30.0,
                             cafile=cafile_from(getattr(args, "cacert", ""), api))
        self.deployment = Deployment(self.api, args.base_url, args.domain)
        self.host = args.host or f"{args.app}.{args.domain}"
        self.events: list[Event] = []
        self.undo: list[tuple[str, Callable[[], Any]]] = []
        self.action_error = ""

    def run(self) -> int:
        self.report.mkdir(parents=True, exist_ok=True)
        try:
            hosts, apps = self.prepare()
            parameters = tool_env(self.args, self.host, hosts, self.report)
            tool = tool_run(self.args, self.report, parameters)
            deadline = BURST_DEADLINE_S if self.scenario.burst else self.args.duration + 120
            with MachineSampler(self.deployment, apps, self.report / "machines.csv",
                                self.args.sample_interval) as sampler:
                origin_ms = time.time() * 1000.0
                code = run_tool(tool, self.report / "tool.log", deadline, self.actions())
                ended_ms = time.time() * 1000.0
                self.events.append(Event(ended_ms, "load ends"))
                self.settle(sampler)
        finally:
            self.restore()
        points = read_points(tool.points)
        summary = summarize(self.args.scenario, self.args.tool, points, sampler.samples,
                            read_export(tool.verdict), (ended_ms - origin_ms) / 1000.0)
        title = (f"thaw loadtest {summary.scenario} ({summary.tool}): "
                 f"{', '.join(hosts) if len(hosts) < 3 else f'{len(hosts)} apps'}")
        plot(self.report / "plot.png", title, points, sampler.samples, self.events, origin_ms)
        shown = {k: v for k, v in parameters.items() if not k.startswith("K6_")}
        (self.report / "summary.md").write_text(report_markdown(
            summary, self.command, self.events, origin_ms, shown, code))
        print(f"\n{summary_table(summary)}\nreport: {self.report}/summary.md, "
              f"{self.report}/plot.png", flush=True)
        if self.scenario.action == "kill" and not self.args.kill_cmd:
            print("thaw loadtest: the killed agent stays down; start it again to get its "
                  "worker back", flush=True)
        if self.action_error:
            print(f"thaw loadtest: {self.action_error}", file=sys.stderr)
        return code or (1 if self.action_error else 0)

    # -- before the load -------------------------------------------------------------------

    def prepare(self) -> tuple[list[str], list[str]]:
        """Ready the deployment; returns (Host names to load, apps whose machines to
        sample)."""
        args, scenario, deployment = self.args, self.scenario, self.deployment
        fields = merged(scenario.sets, settings(args.set))
        if scenario.action == "kill" and not args.kill_cmd:  # refused now, not mid-run
            for worker in self.api.get("/v1/workers"):
                if worker.get("healthy"):
                    hostkill.local_agent_pid(hostkill.Victim(worker["id"], worker["url"],
                                                             (), ()))
        if scenario.name == "wake-herd":
            apps = deployment.create_herd(args.app, args.apps, fields)
            for app in apps:
                self.undo.append((f"delete app {app}", partial(deployment.delete, app)))
            return [f"{app}.{args.domain}" for app in apps], apps
        if fields:
            back = deployment.patch(args.app, fields)
            self.undo.append((f"put back {', '.join(back)} of {args.app}",
                              lambda: deployment.api.patch(f"/v1/apps/{args.app}", back)))
            print(f"thaw loadtest: set on {args.app} for the run: {fields}", flush=True)
        if scenario.cold:
            stopped = deployment.put_to_sleep(args.app)
            print(f"thaw loadtest: {args.app} is asleep ({stopped} machine(s) stopped)",
                  flush=True)
        if scenario.warm:
            deployment.wake(self.host, args.path)
            self.wait_for_spares()
        return [self.host], [args.app]

    def wait_for_spares(self) -> None:
        spares = int(self.deployment.app(self.args.app).get("spares", 0))
        if spares:
            standby = ("created", "stopped", "suspended")
            self.deployment.wait(
                lambda: sum(m["state"] in standby for m in self.deployment.machines(
                    self.args.app)) >= spares, 60.0, f"{self.args.app}'s spares were not made")

    # -- during the load -------------------------------------------------------------------

    def actions(self) -> list[tuple[float, Callable[[], None]]]:
        at = self.args.action_at if self.args.action_at is not None else self.args.duration / 2
        if self.scenario.action == "deploy":
            return [(at, lambda: self.act(self.deploy))]
        if self.scenario.action == "kill":
            return [(at, lambda: self.act(self.kill))]
        return []

    def act(self, action: Callable[[], str]) -> None:
        began = time.time() * 1000.0
        try:
            self.events.append(Event(began, action()))
        except Exception as exc:
            self.action_error = f"{self.scenario.action} failed: {exc}"
            self.events.append(Event(began, f"{self.scenario.action} failed"))

    def deploy(self) -> str:
        return self.deployment.deploy(self.args.app, self.args.deploy_image)

    def victim(self) -> hostkill.Victim:
        machines = {app["name"]: self.deployment.machines(app["name"])
                    for app in self.api.get("/v1/apps")}
        return hostkill.choose_victim(self.args.app, self.api.get("/v1/workers"), machines,
                                      self.args.kill_worker)

    def kill(self) -> str:
        victim = self.victim()
        if self.args.kill_cmd:
            hostkill.kill_by_command(victim, self.args.kill_cmd)
        else:
            hostkill.kill_locally(victim, hostkill.local_agent_pid(victim))
        return f"host {victim.worker} killed"

    # -- after the load --------------------------------------------------------------------

    def settle(self, sampler: MachineSampler) -> None:
        """Keep sampling: --settle seconds, or (ramp) until no machine is started."""
        settle_s = self.args.settle if self.args.settle is not None else self.scenario.settle_s
        deadline = time.monotonic() + min(settle_s, SETTLE_MAX_S)
        time.sleep(min(settle_s, 2 * self.args.sample_interval))
        while time.monotonic() < deadline:
            if self.scenario.settle_until_stopped and sampler.started_now() == 0:
                break
            time.sleep(self.args.sample_interval)

    def restore(self) -> None:
        for what, undo in reversed(self.undo):
            try:
                undo()
            except Exception as exc:  # the others are still worth undoing
                print(f"thaw loadtest: could not {what}: {exc}", file=sys.stderr)
        self.undo.clear()
