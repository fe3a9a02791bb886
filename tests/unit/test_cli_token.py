"""Which token the CLI sends: the local platform's admin token only to a local API."""

from __future__ import annotations

from pathlib import Path

import pytest

from thaw.cmdbase import token_from


def test_the_local_admin_token_goes_only_to_an_api_on_this_host(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / ".thaw").mkdir()
    (tmp_path / ".thaw" / "admin.token").write_text("local-admin-token\n")
    monkeypatch.chdir(tmp_path)
    for local in ("http://127.0.0.1:4280", "http://localhost:4280", "http://[::1]:4280"):
        assert token_from("", local) == "local-admin-token"
    for remote in ("http://10.0.0.6:4280", "http://api.example.com", "http://127.0.0.2:4280"):
        assert token_from("", remote) == ""
    assert token_from("given", "http://10.0.0.6:4280") == "given"  # --token / THAW_TOKEN
