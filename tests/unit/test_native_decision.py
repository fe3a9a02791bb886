"""ground.native.decide: a compiled build is used only when it matches the sources exactly."""

from __future__ import annotations

import json

from ground.native import SOURCES, decide

CURRENT: dict[str, object] = {"python": "cpython-311", "sources": {p: "a" * 64 for p in SOURCES}}


def manifest(**changes: object) -> str:
    return json.dumps({**CURRENT, **changes})


def test_a_build_matching_the_sources_and_interpreter_is_used() -> None:
    assert decide(None, manifest(), CURRENT)[0]
    assert decide("1", manifest(), CURRENT)[0]


def test_thaw_native_0_turns_a_matching_build_off() -> None:
    assert decide("0", manifest(), CURRENT) == (False, "THAW_NATIVE=0")


def test_no_build_or_an_unreadable_manifest_is_pure_python() -> None:
    assert not decide(None, None, CURRENT)[0]
    assert not decide(None, "{not json", CURRENT)[0]
    assert not decide(None, "[]", CURRENT)[0]


def test_a_build_for_another_interpreter_is_not_used() -> None:
    assert not decide(None, manifest(python="cpython-312"), CURRENT)[0]


def test_a_build_from_sources_edited_since_is_not_used() -> None:
    edited = dict(CURRENT["sources"])  # type: ignore[call-overload]
    edited["edge/adapters/http1.py"] = "b" * 64
    on, why = decide(None, manifest(sources=edited), CURRENT)
    assert not on and "changed" in why
    fewer = {p: h for p, h in edited.items() if p != "edge/view.py"}
    assert not decide(None, manifest(sources=fewer), CURRENT)[0]
