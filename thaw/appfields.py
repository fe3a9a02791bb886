"""Every field of thaw.toml — its default, its bound and what it means — read from
AppConfig itself, so the docs (docs/cli.md's table, checked by a test), `thaw launch`'s
commented thaw.toml and the code cannot disagree.

`python -m thaw.appfields` prints the table.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import msgspec
import msgspec.inspect as mi

from ground.appconfig import AppConfig

PATTERNS = {  # bounds a pattern sets, in words
    "name": "1 to 63 chars of a-z, 0-9 and `-`",
    "health.path": "≤ 1024 chars, empty or `/…`",
}
LIST_ITEMS = {"regions": "region names", "entrypoint": "arguments of ≤ 4096 chars",
              "cmd": "arguments of ≤ 4096 chars"}
OWN_FIELDS = ("image_digest", "version", "uid", "release",
              "secrets")  # placement's, never an owner's

MEANING = {
    "name": "the app's name, one DNS label (`app` is accepted too); its host is NAME.DOMAIN",
    "image": "`HOST[:PORT]/REPO[:TAG][@sha256:…]` or `oci:PATH[:TAG]`; resolved and pinned "
             "at create and deploy",
    "regions": "where machines run; the first is primary; placement never leaves them",
    "guest.cpus": "CPUs reserved on the worker for each machine",
    "guest.memory_mb": "memory reserved on the worker for each machine, MiB",
    "port": "the port the app listens on, also set as `$PORT` (0: the image's one "
            "ExposedPort, else 8080; bubblewrap machines must listen on `$PORT`)",
    "protocol": "how the edge speaks to the app's machines: `http1`, or `h2c` (HTTP/2 with "
                "prior knowledge: gRPC servers; docs/edge.md, \"gRPC apps\")",
    "entrypoint": "overrides the image's Entrypoint (and drops its Cmd unless `cmd` is set)",
    "cmd": "overrides the image's Cmd",
    "env": "extra environment; `PORT` and `THAW_*` are the platform's",
    "hosts": "extra Host names routed to the app: normalised, held by one app only, never "
             "under the platform's domain",
    "min_machines_running": "machines kept started, never auto-stopped below",
    "max_machines": "machines at most (≥ max(1, min_machines_running))",
    "concurrency.type": "what a machine's load is counted in",
    "concurrency.soft_limit": "load per machine the edge balances to; past it, another "
                              "machine is woken",
    "concurrency.hard_limit": "load per machine never exceeded (≥ soft_limit); past it, "
                              "requests are held",
    "auto_stop": "what an idle machine becomes (`off`: it keeps running)",
    "auto_start": "wake a machine for a request when none has room",
    "idle_timeout_s": "seconds without a request before auto-stop",
    "hold_timeout_s": "longest a request is held for a wake (then 504)",
    "max_pending": "requests held at once for the app (past it: 503 + Retry-After)",
    "spares": "stopped standbys kept on other workers, for a fast replacement",
    "health.path": "readiness: empty waits for the port to accept, else GET this path "
                   "(over HTTP/2 for h2c; `/grpc.health.v1.Health/Check`: gRPC's health "
                   "protocol)",
    "health.interval_s": "seconds between health checks of a running machine",
    "health.timeout_s": "start-to-ready budget of a machine",
    "health.grace_s": "seconds after start before the first check",
    "kill_signal": "the signal that asks a machine to stop (empty: the image's StopSignal, "
                   "else SIGTERM)",
    "kill_timeout_s": "seconds between kill_signal and SIGKILL",
    "deploy.strategy": "how a release replaces machines (docs/placement.md)",
    "deploy.max_unavailable": "machines replaced at once by a rolling deploy",
}


@dataclass(frozen=True)
class FieldDoc:
    path: str  # "guest.cpus"
    table: str  # "" (top level) or "guest"
    key: str  # "cpus"
    default: Any  # msgspec.NODEFAULT: required
    bound: str
    meaning: str

    @property
    def required(self) -> bool:
        return self.default is msgspec.NODEFAULT


def fields() -> list[FieldDoc]:
    """Top-level fields first (in AppConfig's order), then each table's."""
    top: list[FieldDoc] = []
    tables: list[FieldDoc] = []
    for field in mi.type_info(AppConfig).fields:  # type: ignore[attr-defined]
        if field.name in OWN_FIELDS:
            continue
        if isinstance(field.type, mi.StructType):
            for f in field.type.fields:
                path = f"{field.name}.{f.name}"
                tables.append(FieldDoc(path, field.name, f.name, f.default, bound(f.type, path),
                                       MEANING[path]))
            continue
        default = field.default
        if field.default_factory is not msgspec.NODEFAULT:
            default = field.default_factory()
        top.append(FieldDoc(field.name, "", field.name, default, bound(field.type, field.name),
                            MEANING[field.name]))
    return top + tables


def bound(kind: Any, path: str = "") -> str:
    """What a value may be, in words: "0 to 1,000", "≤ 1024 chars", "one of a, b"."""
    if path in PATTERNS:
        return PATTERNS[path]
    if isinstance(kind, mi.LiteralType):
        return "one of " + ", ".join(f"`{v}`" for v in sorted(kind.values))
    if isinstance(kind, mi.BoolType):
        return "true or false"
    if isinstance(kind, mi.IntType | mi.FloatType):
        return f"{_num(kind.ge)} to {_num(kind.le)}"
    if isinstance(kind, mi.StrType):
        return f"≤ {kind.max_length} chars" if kind.max_length else "text"
    if isinstance(kind, mi.ListType):
        low = f"{kind.min_length} to " if kind.min_length else "≤ "
        items = LIST_ITEMS.get(path, "host names")
        return f"{low}{kind.max_length} {items}"
    if isinstance(kind, mi.DictType):
        return f"≤ {kind.max_length} entries, 64 KiB in all"
    return ""


def _num(value: float | None) -> str:
    if value is None:
        return "∞"
    return f"{value:,g}" if value < 10**6 else f"{value:,.0f}"


def toml_value(value: Any) -> str:
    """A value as TOML (strings, numbers, booleans, lists of those, tables of strings)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a TOML basic string
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {toml_value(v)}"
                               for k, v in value.items()) + "}"
    raise TypeError(f"no TOML form for {value!r}")


def markdown_table() -> str:
    rows = ["| field | default | bound | meaning |", "|---|---|---|---|"]
    for f in fields():
        default = "required" if f.required else f"`{toml_value(f.default)}`"
        rows.append(f"| `{f.path}` | {default} | {f.bound} | {f.meaning} |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(markdown_table())
