"""An image's config over its base's: Docker's merge rules, as pure functions."""

from __future__ import annotations

import pytest

from thaw.imageconfig import (
    ConfigChanges,
    base_history,
    entrypoint_and_cmd,
    expose_entry,
    image_config_doc,
    merge_env,
    merge_run_config,
)

PYTHON_BASE = {"Env": ["PATH=/usr/bin", "LANG=C.UTF-8"], "Cmd": ["python3"],
               "WorkingDir": "/home", "User": "app", "StopSignal": "SIGTERM",
               "ExposedPorts": {"80/tcp": {}}, "Labels": {"base": "yes"}}


def test_env_merges_by_name_the_child_wins_and_the_base_order_is_kept() -> None:
    merged = merge_env(["PATH=/usr/bin", "LANG=C.UTF-8"], [("PATH", "/opt:/usr/bin"), ("A", "1")])
    assert merged == ["PATH=/opt:/usr/bin", "LANG=C.UTF-8", "A=1"]


def test_a_child_entrypoint_drops_the_base_cmd() -> None:
    assert entrypoint_and_cmd(None, ["python3"], ["python3", "app.py"], None) == (
        ["python3", "app.py"], None)


def test_a_child_entrypoint_with_its_own_cmd_keeps_that_cmd() -> None:
    assert entrypoint_and_cmd(["old"], ["x"], ["new"], ["--flag"]) == (["new"], ["--flag"])


def test_a_child_cmd_alone_keeps_the_base_entrypoint() -> None:
    assert entrypoint_and_cmd(["tini", "--"], ["sh"], None, ["app"]) == (["tini", "--"], ["app"])


def test_nothing_set_inherits_both() -> None:
    assert entrypoint_and_cmd(["e"], ["c"], None, None) == (["e"], ["c"])


def test_an_empty_cmd_set_on_purpose_replaces_the_base_cmd() -> None:
    assert entrypoint_and_cmd(None, ["python3"], None, []) == (None, [])


def test_workdir_user_stopsignal_ports_and_labels_are_inherited_unless_set() -> None:
    merged = merge_run_config(PYTHON_BASE, ConfigChanges(expose=["8080/tcp"],
                                                         labels={"app": "hello"}))
    assert (merged["WorkingDir"], merged["User"], merged["StopSignal"]) == (
        "/home", "app", "SIGTERM")
    assert merged["ExposedPorts"] == {"80/tcp": {}, "8080/tcp": {}}
    assert merged["Labels"] == {"base": "yes", "app": "hello"}
    assert merged["Cmd"] == ["python3"] and "Entrypoint" not in merged


def test_settings_of_the_child_win_over_the_base() -> None:
    changes = ConfigChanges(workdir="/srv", user="root", stop_signal="SIGINT",
                            entrypoint=["python3", "app.py"])
    merged = merge_run_config(PYTHON_BASE, changes)
    assert (merged["WorkingDir"], merged["User"], merged["StopSignal"]) == (
        "/srv", "root", "SIGINT")
    assert merged["Entrypoint"] == ["python3", "app.py"] and "Cmd" not in merged


def test_config_doc_lists_the_base_diff_ids_then_the_new_and_the_history() -> None:
    base = {"architecture": "amd64", "os": "linux", "config": PYTHON_BASE,
            "rootfs": {"type": "layers", "diff_ids": ["sha256:a"]},
            "history": [{"created_by": "base"}]}
    history = [*base_history(base, 1, "builtin:python3"), {"created_by": "COPY . /app"}]
    doc = image_config_doc(base, ConfigChanges(), ["sha256:a", "sha256:b"], history)
    assert doc["rootfs"] == {"type": "layers", "diff_ids": ["sha256:a", "sha256:b"]}
    assert [h["created_by"] for h in doc["history"]] == ["base", "COPY . /app"]


def test_a_base_without_history_gets_one_entry_per_layer() -> None:
    made = base_history({"history": [{"created_by": "x", "empty_layer": True}]}, 2, "r")
    assert made == [{"created_by": "layer 1 of r"}, {"created_by": "layer 2 of r"}]


def test_scratch_makes_a_plain_config() -> None:
    doc = image_config_doc({}, ConfigChanges(cmd=["./app"]), ["sha256:c"], [])
    assert (doc["architecture"], doc["os"], doc["config"]) == (
        "amd64", "linux", {"Env": [], "Cmd": ["./app"]})


@pytest.mark.parametrize("given, expected", [
    ("8080", "8080/tcp"), ("53/udp", "53/udp"), ("443/TCP", "443/tcp")])
def test_expose_entries_name_their_protocol(given: str, expected: str) -> None:
    assert expose_entry(given) == expected


@pytest.mark.parametrize("given", ["0", "70000", "http", "80/sctp", "8000-8010"])
def test_expose_refuses_what_is_not_one_port(given: str) -> None:
    with pytest.raises(ValueError, match="bad port"):
        expose_entry(given)
