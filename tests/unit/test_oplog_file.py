"""The op log on disk: durable appends, torn tails cut at open, atomic compaction."""

from __future__ import annotations

from pathlib import Path

from agent.core import oplog_codec
from agent.core.records import Boot, Created, MachineSpec, Transition
from agent.core.state import replay, snapshot
from agent.oplog import OpLog

SPEC = MachineSpec(app="hello", image="img")


def test_a_log_with_a_torn_last_record_replays_to_the_state_before_that_record(
    tmp_path: Path,
) -> None:
    path = tmp_path / "oplog"
    log = OpLog(path)
    log.open()
    log.append(Created("m1", SPEC, "k", 1.0))
    log.append(Transition("m1", "start", "starting", 2.0))
    log.close()
    before = replay(OpLog(path).open())
    torn = oplog_codec.encode(Transition("m1", "ready", "started", 3.0))
    with open(path, "ab") as out:
        out.write(torn[: len(torn) // 2])  # the agent died mid-append
    reopened = OpLog(path)
    records = reopened.open()
    assert reopened.dropped_torn_tail
    assert replay(records).machines["m1"].state == before.machines["m1"].state == "starting"
    reopened.append(Transition("m1", "ready", "started", 4.0))  # appends after the cut
    reopened.close()
    assert replay(OpLog(path).open()).machines["m1"].state == "started"


def test_compaction_replaces_the_log_by_a_snapshot_with_the_same_state(tmp_path: Path) -> None:
    path = tmp_path / "oplog"
    log = OpLog(path)
    log.open()
    log.append(Boot(3, 0.0))
    for i in range(50):
        log.append(Created(f"m{i}", SPEC, f"k{i}", float(i)))
        log.append(Transition(f"m{i}", "destroy", "destroying", float(i)))
        if i % 2:
            log.append(Transition(f"m{i}", "destroyed", "destroyed", float(i)))
    state = replay(OpLog(path).open())
    log.compact(snapshot(state))
    log.append(Transition("m0", "destroyed", "destroyed", 99.0))
    log.close()
    again = replay(OpLog(path).open())
    assert again.epoch == 3
    assert set(again.machines) == set(state.machines) - {"m0"}
    assert not (tmp_path / "oplog.compact").exists()
