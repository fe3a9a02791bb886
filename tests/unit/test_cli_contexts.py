"""The CLI's contexts (thaw/contexts.py): written whole, read back, one current, unknown
names refused naming the known ones, a broken file named; and which API, token and CA a
command uses (thaw/cmdbase.py client_of)."""

from __future__ import annotations

import argparse
import os
import stat
from pathlib import Path

import pytest

from thaw import contexts
from thaw.cmdbase import client_of


@pytest.fixture(autouse=True)
def config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("THAW_CONFIG", str(tmp_path / "cfg"))
    monkeypatch.chdir(tmp_path)  # no ./.thaw here: only contexts give a token
    return tmp_path / "cfg"


def test_the_first_context_is_current_and_use_and_remove_move_it(config: Path) -> None:
    assert contexts.load() == contexts.Contexts()
    contexts.put("local", contexts.Context(api="http://127.0.0.1:5000"))
    contexts.put("prod", contexts.Context(api="https://api.example:443"))
    assert contexts.load().current == "local"  # a second one does not take over
    contexts.use("prod")
    assert contexts.chosen("") == contexts.Context(api="https://api.example:443")
    assert contexts.chosen("local").api == "http://127.0.0.1:5000"
    contexts.remove("prod")
    assert contexts.load().current == "" and contexts.chosen("") is None
    assert stat.S_IMODE(os.stat(config / contexts.FILE).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(config).st_mode) == 0o700


def test_an_unknown_or_bad_name_and_a_broken_file_are_errors_that_say_so(
    config: Path,
) -> None:
    contexts.put("local", contexts.Context(api="http://127.0.0.1:5000"))
    with pytest.raises(contexts.ContextError, match=r"no context 'nope' \(known: local"):
        contexts.chosen("nope")
    with pytest.raises(contexts.ContextError, match="a context name"):
        contexts.put("../x", contexts.Context(api="http://h:1"))
    (config / contexts.FILE).write_text("{not json")
    with pytest.raises(contexts.ContextError, match="not a contexts file"):
        contexts.load()


def args(**given: str) -> argparse.Namespace:
    return argparse.Namespace(**{"api": "", "token": "", "cacert": "", "context": "",
                                 **given})


def test_a_command_uses_the_contexts_api_token_and_ca_unless_given_an_api(
    tmp_path: Path,
) -> None:
    token_file = tmp_path / "admin.token"
    token_file.write_text("s3cret\n")
    ca = tmp_path / "ca.pem"
    contexts.put("up", contexts.Context(api="http://127.0.0.1:5123",
                                        token_file=str(token_file), cacert=str(ca)))
    client = client_of(args())
    assert (client.host, client.port, client.token) == ("127.0.0.1", 5123, "s3cret")
    elsewhere = client_of(args(api="http://127.0.0.1:6000"))  # an --api of its own
    assert (elsewhere.port, elsewhere.token) == (6000, "")  # never the context's token
    token_file.unlink()
    with pytest.raises(contexts.ContextError, match="token file"):
        client_of(args())


def test_with_no_context_the_default_api_is_the_local_one() -> None:
    assert client_of(args()).port == 4280
