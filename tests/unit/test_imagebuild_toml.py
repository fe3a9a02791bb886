"""thaw-image.toml as a build plan: where the app's files go and what the config says."""

from __future__ import annotations

from pathlib import Path

import pytest

from thaw.imagebase import BaseImage
from thaw.imagebuild import BuildError, BuildOverrides, read_settings, toml_plan


def base_with(workdir: str = "") -> BaseImage:
    config = {"WorkingDir": workdir} if workdir else {}
    return BaseImage("builtin:python3", [], {"config": config})


def plan_of(settings: dict[str, object], overrides: BuildOverrides | None = None,
            base: BaseImage | None = None) -> tuple[str, str | None]:
    made = toml_plan(settings, overrides or BuildOverrides(), lambda _ref: base or base_with())
    return made.layers[0].copies[0].dest, made.changes.workdir


def test_from_scratch_without_a_workdir_keeps_the_files_at_the_root() -> None:
    assert plan_of({}) == ("/", None)


def test_on_a_base_the_files_go_to_app_which_becomes_the_workdir() -> None:
    assert plan_of({"from": "builtin:python3"}) == ("/app/", "/app")


def test_a_workdir_puts_the_files_there_as_copy_dot_workdir_would() -> None:
    assert plan_of({"from": "builtin:python3", "workdir": "/srv"}) == ("/srv/", "/srv")
    assert plan_of({"workdir": "/srv"}) == ("/srv/", "/srv")


def test_the_bases_workdir_is_used_when_the_toml_sets_none() -> None:
    assert plan_of({"from": "oci:/l:base"}, base=base_with("/opt")) == ("/opt/", "/opt")


def test_from_on_the_command_line_wins_over_the_toml() -> None:
    made = toml_plan({"from": "builtin:python3"}, BuildOverrides(base="scratch"),
                     lambda _ref: base_with())
    assert made.base == "scratch"


def test_user_stop_signal_entrypoint_and_env_reach_the_config() -> None:
    made = toml_plan({"from": "builtin:python3", "user": "app", "stop_signal": "SIGINT",
                      "entrypoint": "python3 app.py", "env": {"B": 2, "A": "1"}, "expose": 8080},
                     BuildOverrides(), lambda _ref: base_with())
    changes = made.changes
    assert (changes.user, changes.stop_signal, changes.entrypoint) == (
        "app", "SIGINT", ["python3", "app.py"])
    assert changes.env == [("A", "1"), ("B", "2")] and changes.expose == ["8080/tcp"]
    assert changes.cmd is None  # not set: the base's Cmd goes, as Docker's rule says


def test_an_unknown_setting_is_refused_naming_the_known_ones(tmp_path: Path) -> None:
    (tmp_path / "thaw-image.toml").write_text('form = "builtin:python3"\n')
    with pytest.raises(BuildError, match=r"unknown setting 'form'.*from"):
        read_settings(tmp_path)
