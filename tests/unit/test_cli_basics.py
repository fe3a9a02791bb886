"""The CLI as a user meets it first: --version, help for every command and flag, one-line
errors (a traceback only with --debug), "did you mean", `--api host:port`, completion."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from thaw.cli import build_parser, main
from thaw.cmdbase import api_url
from thaw.completion import command_tree


def walk(parser: argparse.ArgumentParser, path: str = "thaw"):  # type: ignore[no-untyped-def]
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from walk(child, f"{path} {name}")


def test_every_command_has_a_description_and_every_flag_a_help_line() -> None:
    missing = []
    for path, parser in walk(build_parser()):
        if not parser.description:
            missing.append(path)
        missing.extend(f"{path} {a.option_strings or a.dest}" for a in parser._actions
                       if not a.help and not isinstance(a, argparse._SubParsersAction))
    assert missing == []


def test_version_prints_and_exits_zero(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out.startswith("thaw ")


def test_a_mistyped_command_gets_a_suggestion(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["deplyo"])
    assert done.value.code == 2 and "did you mean 'deploy'?" in capsys.readouterr().err


@pytest.mark.parametrize("text, why", [
    ("", "no thaw.toml"),
    ("name = 'x\n", "not valid TOML"),
])
def test_a_missing_or_broken_thaw_toml_is_one_line(
    tmp_path: Path, text: str, why: str,
) -> None:
    path = tmp_path / "thaw.toml"
    if text:
        path.write_text(text)
    run = subprocess.run([sys.executable, "-m", "thaw", "deploy", "-c", str(path), "--api",
                          "127.0.0.1:9"], capture_output=True, text=True, cwd=tmp_path,
                         timeout=60)
    assert run.returncode != 0 and "Traceback" not in run.stderr
    assert len(run.stderr.strip().splitlines()) == 1 and why.split()[-1] in run.stderr
    debug = subprocess.run([sys.executable, "-m", "thaw", "--debug", "deploy", "-c",
                            str(path)], capture_output=True, text=True, cwd=tmp_path,
                           timeout=60)
    assert debug.returncode != 0 and "Traceback" in debug.stderr


def test_api_takes_host_port_and_says_what_it_expected() -> None:
    assert api_url("127.0.0.1:4280") == "http://127.0.0.1:4280"
    assert api_url("http://a.example:1") == "http://a.example:1"
    for bad in ("ftp://x:1", "127.0.0.1:port", "http://"):
        with pytest.raises(ValueError, match="expected host:port"):
            api_url(bad)


def test_completion_scripts_name_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    tree = command_tree(build_parser())
    assert "machines" in tree[""][0] and "--image" in tree["apps create"][1]
    for shell in ("bash", "zsh", "fish"):
        assert main(["completion", shell]) == 0
        script = capsys.readouterr().out
        assert "deploy" in script and "suspend" in script
    assert main(["completion", "bash"]) == 0
    script = capsys.readouterr().out
    check = subprocess.run(["bash", "-n"], input=script, text=True, capture_output=True)
    assert check.returncode == 0, check.stderr


def test_every_sub_commands_help_exits_zero_and_shows_its_description(
    capsys: pytest.CaptureFixture[str],
) -> None:
    for path, parser in walk(build_parser()):
        with pytest.raises(SystemExit) as done:
            main([*path.split()[1:], "--help"])
        out = capsys.readouterr().out
        assert done.value.code == 0, path
        assert parser.description and parser.description.split("\n")[0][:40] in out, path


def test_thaw_up_logs_every_cold_answer_and_one_warm_answer_in_a_hundred(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from edge.core.accesslog import logged
    from thaw.cli import up_config

    monkeypatch.delenv("THAW_ACCESS_LOG_SAMPLE", raising=False)
    rate = up_config(build_parser().parse_args(["up"])).access_log_sample_rate
    draws = iter(i / 1000 for i in range(1000))  # evenly over [0, 1)
    warm = sum(logged(200, False, rate, lambda: next(draws)) for _ in range(1000))
    assert warm == 10
    assert logged(200, True, rate, lambda: 0.5) and logged(502, False, rate, lambda: 0.5)
    edge = build_parser().parse_args(["edge"])
    assert edge.access_log_sample == 1.0  # `thaw edge` logs all it logs, unless told
