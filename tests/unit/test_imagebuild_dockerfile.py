"""The Dockerfile subset: parsing, substitution, and the plan it makes (no base is loaded)."""

from __future__ import annotations

from typing import Any

import pytest

from thaw.dockerfile import DockerfileError, expand, parse_dockerfile, split_words
from thaw.dockerplan import DockerfilePlan, plan_dockerfile

BASE_CONFIG: dict[str, Any] = {"Env": ["PATH=/usr/bin", "LANG=C.UTF-8"], "WorkingDir": ""}


def plan(text: str, build_args: dict[str, str] | None = None,
         base: dict[str, Any] | None = None) -> DockerfilePlan:
    return plan_dockerfile(parse_dockerfile(text), build_args or {},
                           lambda _ref: base if base is not None else BASE_CONFIG)


def test_continuation_lines_join_and_comments_inside_them_are_dropped() -> None:
    text = "FROM scratch\n# a comment\nENV A=1 \\\n# inside\n    B=2\n\nCMD [\"x\"]\n"
    found = parse_dockerfile(text)
    assert [(i.line, i.keyword, i.args) for i in found] == [
        (1, "FROM", "scratch"), (3, "ENV", "A=1 B=2"), (7, "CMD", '["x"]')]


def test_instruction_keywords_are_case_insensitive() -> None:
    assert [i.keyword for i in parse_dockerfile("from scratch\ncopy a /b\n")] == ["FROM", "COPY"]


def test_syntax_directive_is_ignored_and_another_escape_character_is_refused() -> None:
    assert parse_dockerfile("# syntax=docker/dockerfile:1\nFROM scratch\n")[0].line == 2
    with pytest.raises(DockerfileError, match="escape"):
        parse_dockerfile("# escape=`\nFROM scratch\n")


def test_run_is_refused_naming_its_line_and_that_it_needs_a_container() -> None:
    with pytest.raises(DockerfileError) as raised:
        plan("FROM scratch\nCOPY a /a\n\nRUN apt-get install -y curl\n")
    assert raised.value.line == 4
    assert raised.value.message.startswith("RUN needs a container to run in")


@pytest.mark.parametrize("text, words", [
    ("FROM scratch\nFROM scratch\n", "multi-stage"),
    ("FROM scratch\nCOPY --from=build /a /a\n", "multi-stage"),
    ("FROM scratch\nHEALTHCHECK CMD true\n", "[health]"),
    ("FROM scratch\nVOLUME /data\n", "volumes"),
    ("FROM scratch\nFROBNICATE x\n", "unknown instruction FROBNICATE"),
    ("ENV A=1\nFROM scratch\n", "ENV before FROM"),
    ("ARG A=1\n", "no FROM"),
    ("FROM scratch\nADD https://example.com/x.tgz /x\n", "URLs are not supported"),
    ("FROM scratch\nCOPY --chmod=4755 a /a\n", "setuid"),
])
def test_what_thaw_cannot_build_is_refused_with_a_reason(text: str, words: str) -> None:
    with pytest.raises(DockerfileError, match=words.replace("[", r"\[")):
        plan(text)


def test_global_arg_reaches_from_and_build_arg_wins_over_its_default() -> None:
    assert plan("ARG BASE=builtin:busybox\nFROM $BASE\n").base == "builtin:busybox"
    given = plan("ARG BASE=builtin:busybox\nFROM ${BASE}\n", {"BASE": "builtin:python3"})
    assert given.base == "builtin:python3"


def test_global_arg_is_in_scope_after_from_only_when_declared_again() -> None:
    text = "ARG V=1\nFROM scratch\nENV A=${V:-unset}\nARG V\nENV B=$V\n"
    assert plan(text).changes.env == [("A", "unset"), ("B", "1")]


def test_env_wins_over_an_arg_of_the_same_name() -> None:
    text = "FROM scratch\nARG X=from-arg\nENV X=from-env\nENV Y=$X\n"
    assert plan(text, {"X": "given"}).changes.env[-1] == ("Y", "from-env")


def test_unused_build_args_are_reported() -> None:
    assert plan("FROM scratch\nARG USED\n", {"USED": "1", "TYPO": "2"}).unused_build_args == [
        "TYPO"]


def test_env_sees_the_base_images_env_and_both_env_forms_parse() -> None:
    text = 'FROM scratch\nENV PATH=/opt/bin:$PATH MSG="two words"\nENV OLD the rest  here\n'
    assert plan(text).changes.env == [
        ("PATH", "/opt/bin:/usr/bin"), ("MSG", "two words"), ("OLD", "the rest  here")]


def test_workdir_is_relative_to_the_previous_one_and_made_in_the_next_copy_layer() -> None:
    made = plan("FROM scratch\nWORKDIR /srv\nWORKDIR app\nCOPY . .\n")
    assert made.changes.workdir == "/srv/app"
    assert [(layer.dirs, layer.copies[0].dest) for layer in made.layers] == [
        (["/srv", "/srv/app"], "/srv/app/")]


def test_a_workdir_after_the_last_copy_gets_a_layer_of_its_own() -> None:
    made = plan("FROM scratch\nCOPY a /a\nWORKDIR /data\n")
    assert [layer.dirs for layer in made.layers] == [[], ["/data"]]
    assert [h.layer for h in made.history] == [True, False, True]


def test_each_copy_and_add_is_one_layer_with_its_flags() -> None:
    made = plan("FROM scratch\nWORKDIR /app\nCOPY --chown=app:app --chmod=755 a b ./\n"
                'ADD ["c d", "/opt/"]\n')
    first, second = (layer.copies[0] for layer in made.layers)
    assert (first.sources, first.dest, first.chown, first.chmod) == (
        ["a", "b"], "/app/", "app:app", 0o755)
    assert (second.sources, second.dest, second.add) == (["c d"], "/opt/", True)


def test_cmd_and_entrypoint_take_exec_form_and_shell_form() -> None:
    made = plan('FROM scratch\nENTRYPOINT ["python3", "app.py"]\nCMD --port $PORT\n')
    assert made.changes.entrypoint == ["python3", "app.py"]
    assert made.changes.cmd == ["/bin/sh", "-c", "--port $PORT"]  # not substituted


def test_shell_changes_the_shell_form_and_an_empty_cmd_stays_set() -> None:
    made = plan('FROM scratch\nSHELL ["/bin/ash", "-eo", "pipefail", "-c"]\nCMD echo hi\n')
    assert made.changes.cmd == ["/bin/ash", "-eo", "pipefail", "-c", "echo hi"]
    assert plan("FROM scratch\nCMD []\n").changes.cmd == []


def test_label_expose_user_stopsignal_are_recorded() -> None:
    made = plan('FROM scratch\nARG V=2\nLABEL a=1 "b c"="d e" v=$V\nEXPOSE 8080 53/udp\n'
                "USER app:app\nSTOPSIGNAL SIGINT\n")
    assert made.changes.labels == {"a": "1", "b c": "d e", "v": "2"}
    assert made.changes.expose == ["8080/tcp", "53/udp"]
    assert (made.changes.user, made.changes.stop_signal) == ("app:app", "SIGINT")


def test_expose_refuses_a_port_that_is_not_one() -> None:
    with pytest.raises(DockerfileError, match="EXPOSE: bad port") as raised:
        plan("FROM scratch\n\nEXPOSE http\n")
    assert raised.value.line == 3


@pytest.mark.parametrize("word, expected", [
    ("$A", "1"), ("${A}b", "1b"), ("'$A'", "$A"), ('"$A $B"', "1 "), (r"\$A", "$A"),
    ("${B:-x}", "x"), ("${B-x}", "x"), ("${E-x}", ""), ("${E:-x}", "x"), ("${A:+y}", "y"),
    ("${B:+y}", ""), ("a${A}${A}", "a11"), ("$", "$"), ("$1", "$1"),
])
def test_expand_follows_dockers_substitution(word: str, expected: str) -> None:
    assert expand(word, {"A": "1", "E": ""}) == expected


def test_split_words_keeps_quoted_spaces_in_one_word() -> None:
    assert split_words('A="x y" B=\'z w\' C=v\\ w') == ['A="x y"', "B='z w'", "C=v\\ w"]
    with pytest.raises(ValueError, match="unmatched"):
        split_words('A="x')
