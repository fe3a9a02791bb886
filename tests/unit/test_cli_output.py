"""The CLI's pure parts: tables that fit 100 columns, thaw launch's file, deploy's patch,
and docs/cli.md's field table made from AppConfig itself."""

from __future__ import annotations

import tomllib
from pathlib import Path

import msgspec
import pytest

from ground.appconfig import AppConfig, parse
from thaw.appfields import fields, markdown_table, toml_value
from thaw.cmd_apps import changed, declared, replacing
from thaw.cmdbase import app_fields
from thaw.launch import default_name, render
from thaw.tables import shorten, table

DOCS = Path(__file__).resolve().parents[2] / "docs" / "cli.md"


def test_a_table_fits_100_columns_by_shortening_its_widest_columns_in_the_middle(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)  # and stdout is not a terminal here
    rows = [{"name": "hello", "image": "oci:/" + "x" * 150 + ":latest", "state": "started"}]
    out = table(rows, ["name", "state", "image"])
    assert max(len(line) for line in out.splitlines()) <= 100
    assert ":latest" in out and "oci:/" in out and "…" in out
    narrow = table([{"a": "1"}], ["a"])
    assert narrow == "A\n1"


def test_a_table_takes_the_width_columns_says_within_bounds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rows = [{"name": "hello", "image": "oci:/" + "x" * 150 + ":latest", "state": "started"}]
    monkeypatch.setenv("COLUMNS", "200")  # was ignored: the image cut at 100 columns
    wide = table(rows, ["name", "state", "image"])
    assert "x" * 150 in wide and "…" not in wide
    monkeypatch.setenv("COLUMNS", "20")  # too narrow to be useful: 60
    assert max(len(line) for line in table(rows, ["name", "state", "image"]).splitlines()) == 60


def test_shorten_keeps_both_ends() -> None:
    assert shorten("abcdefghij", 5) == "ab…ij"
    assert shorten("abc", 5) == "abc"


def test_launch_renders_every_field_and_its_text_parses_as_the_config_deploy_sends() -> None:
    text = render({"name": "web", "image": "registry:5000/web:v1",
                   "concurrency.soft_limit": 4, "regions": ["local"]})
    data = app_fields(tomllib.loads(text))
    config = parse(data)
    assert (config.name, config.concurrency.soft_limit, config.max_machines) == ("web", 4, 3)
    for field in fields():  # every field is in the file, set or commented at its default
        key = "app" if field.path == "name" else field.key
        assert f"{key} = " in text, field.path


def test_launch_names_an_app_after_its_directory_when_that_is_a_valid_name() -> None:
    assert default_name("My_Web App") == "my-web-app"
    assert default_name("___") == ""


def test_toml_values_are_read_back_as_written() -> None:
    for value in ("a \"quoted\" ünïcode\n", 3, 0.5, True, ["a", "b"], {"K": "v"}, {}, []):
        assert tomllib.loads(f"x = {toml_value(value)}")["x"] == value


def test_deploy_sends_every_declared_field_and_removes_env_no_longer_declared() -> None:
    wanted = declared(parse({"name": "a", "image": "r/a:1", "env": {"KEEP": "1"}}))
    assert "version" not in wanted and "image_digest" not in wanted
    assert wanted["max_machines"] == 3  # a field left out of thaw.toml is its default
    current = msgspec.to_builtins(AppConfig(name="a", image="r/a:1",
                                            env={"KEEP": "0", "OLD": "x"}))
    patch = replacing(current, wanted)
    assert patch["env"] == {"OLD": None, "KEEP": "1"}


def test_update_prints_what_changed() -> None:
    before = msgspec.to_builtins(AppConfig(name="a", image="r/a:1"))
    after = {**before, "max_machines": 5, "concurrency": {**before["concurrency"],
                                                           "soft_limit": 9}}
    assert changed(before, after) == ("updated a: max_machines 3 -> 5, "
                                      "concurrency.soft_limit 20 -> 9")
    assert changed(before, before) == "a: nothing changed"


def test_docs_cli_md_lists_every_thaw_toml_field_with_its_default_and_bound() -> None:
    assert markdown_table() in DOCS.read_text(), (
        "docs/cli.md's thaw.toml table is out of date: paste `python -m thaw.appfields`")


@pytest.mark.parametrize("field", [f.path for f in fields()])
def test_every_field_has_a_meaning_and_a_bound(field: str) -> None:
    doc = next(f for f in fields() if f.path == field)
    assert doc.meaning and doc.bound


@pytest.mark.parametrize("columns", ["80", "200"])
def test_a_reason_is_printed_in_full_under_its_row_every_line_indented(
    columns: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("COLUMNS", columns)  # the reason is longer than either
    why = ("machine m1 of release 2 failed: crashed 6 times in 60s; last: exited(3); last "
           "output:\n2026-11-27T12:00:00.123Z " + "cannot open the flux capacitor " * 5)
    rows = [{"version": 2, "status": "failed", "reason": why},
            {"version": 1, "status": "complete", "reason": ""}]
    lines = table(rows, ["version", "status"], below="reason").split("\n")
    assert lines[0].split() == ["VERSION", "STATUS"]
    assert lines[1].split() == ["2", "failed"]
    assert lines[2] == "    " + why.splitlines()[0]  # whole, not cut to the terminal
    assert lines[3] == ("    " + why.splitlines()[1]).rstrip()
    assert lines[4].split() == ["1", "complete"] and len(lines) == 5


def test_thaw_machines_says_under_a_machine_how_it_last_ended_unless_a_clean_stop() -> None:
    from thaw.cmd_machines import machine_table

    def machine(mid: str, event: str, reason: str) -> dict[str, object]:
        return {"id": mid, "state": "starting", "events": [
            {"state": "starting", "event": event, "at": 1.0, "reason": reason}]}

    lines = machine_table([machine("m1", "crash", "oom"), machine("m2", "exited", "exited(0)"),
                           machine("m3", "ready", "")]).split("\n")
    assert lines[1].startswith("m1") and lines[2] == "    crash: oom"
    assert lines[3].startswith("m2") and lines[4].startswith("m3") and len(lines) == 5


def test_what_a_machine_wrote_cannot_drive_the_operators_terminal_or_forge_a_line() -> None:
    from thaw.tables import printable

    assert printable("ok\x1b]0;OWNED\x07\x1b[2J") == "ok\\x1b]0;OWNED\\x07\\x1b[2J"
    assert printable("benign\r1999-01-01T00:00:00.000Z spoofed") == (
        "benign\\r1999-01-01T00:00:00.000Z spoofed")
    assert printable("a\u2028b\tc") == "a\\u2028b\tc"  # a tab is kept
    rows = [{"version": 2, "reason": "crashed; last output:\n\x1b[31mred\x1b[0m"}]
    assert "\x1b" not in table(rows, ["version"], below="reason")
