"""The ACL per role built from keys.py, and the registry and store URLs with credentials."""

from __future__ import annotations

import fnmatch
import inspect
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

from ground.registry import acl, keys
from ground.registry.access import shown, user_of, where, with_credentials
from placement.store.factory import with_password

SAMPLE = {"worker_id": "w1", "worker": "w1", "digest": "sha256:ab", "app": "web",
          "name": "app:web", "epoch": 3}


def sample_keys() -> dict[str, str]:
    """One key of every family keys.py builds."""
    found = {}
    for name, fn in inspect.getmembers(keys, inspect.isfunction):
        params = inspect.signature(fn).parameters
        found[name] = fn(*(SAMPLE[p] for p in params))
    return found


def granted(role: str, key: str, write: bool, worker: str = "") -> set[str]:
    """The commands `role` may send on `key` (writing ones only where it may write)."""
    return {c for g in acl.grants(role, worker)
            if fnmatch.fnmatchcase(key, g.pattern) and (g.write or not write)
            for c in g.commands}


def test_every_key_family_in_keys_py_is_granted_to_some_role() -> None:
    channels = {c for listed in acl.CHANNELS.values() for c in listed}
    for name, key in sample_keys().items():
        if key in channels:  # a pub/sub channel, not a key: granted as one (below)
            continue
        assert any(granted(role, key, False) for role in acl.ROLES), name


def test_an_agent_user_for_one_worker_writes_its_own_keys_and_not_another_workers() -> None:
    for own, other in ((keys.worker("w1"), keys.worker("w2")),
                       (keys.worker_epoch("w1"), keys.worker_epoch("w2")),
                       (keys.worker_layers("w1"), keys.worker_layers("w2"))):
        assert granted("agent", own, True, worker="w1")
        assert not granted("agent", other, False, worker="w1")
    assert granted("agent", keys.worker("w2"), True)  # a user for any worker


def test_no_agent_user_may_read_or_write_routes_leases_or_the_edges_keys() -> None:
    for key in (keys.apps(), keys.lease("app:web"), keys.lease_tokens(),
                keys.worker_failures(), keys.machine_load(), keys.wake_demand("web"),
                keys.placements()):
        assert not granted("agent", key, False), key
        assert not granted("agent", key, False, worker="w1"), key


def test_the_edge_only_reads_routes_machines_and_one_worker_at_a_time() -> None:
    assert granted("edge", keys.apps(), False) == {"hget", "hgetall", "hvals", "hkeys"}
    assert not granted("edge", keys.apps(), True)
    assert not granted("edge", keys.machines("web"), True)
    # a worker's heartbeat by id (its agent's URL, for the edge's own thaw), never written
    assert granted("edge", keys.worker("w1"), False) == {"get"}
    assert not granted("edge", keys.worker("w1"), True)
    assert not granted("edge", keys.workers(), False)
    # where wakes go: only placements write it, edges read it
    assert granted("edge", keys.placements(), False) == {"hgetall"}
    assert not granted("edge", keys.placements(), True)
    assert granted("placement", keys.placements(), True)


def test_every_role_denies_all_but_its_listed_commands() -> None:
    for role in acl.ROLES:
        rules = acl.rules(role, "0" * 64)
        channels = [f"&{c}" for c in acl.CHANNELS.get(role, ())]
        assert rules[:5 + len(channels)] == ["reset", "on", "#" + "0" * 64, "resetchannels",
                                             *channels, "-@all"]
        allowed = {word[1:] for rule in rules for word in rule.strip("()").split()
                   if word.startswith("+")}
        assert not any(c.startswith("@") for c in allowed)  # no category, only commands
        assert not allowed & {"flushall", "flushdb", "config", "keys", "scan", "debug",
                              "shutdown", "module", "acl", "script", "eval", "monitor",
                              "psubscribe", "pubsub"}
        # pub/sub only where a channel is granted: placement's lease releases
        assert bool(allowed & {"publish", "subscribe"}) == bool(channels), role
    assert {"placement": (keys.lease_released(),)} == acl.CHANNELS


def test_a_worker_id_that_could_widen_a_pattern_or_an_unknown_role_is_refused() -> None:
    for worker in ("w*", "w?", "w[1]", "a" * 65, "w 1"):
        with pytest.raises(ValueError, match="worker id"):
            acl.grants("agent", worker)
    with pytest.raises(ValueError, match="role must be one of"):
        acl.grants("admin")
    with pytest.raises(ValueError, match="agent role only"):
        acl.grants("edge", "w1")


def test_an_acl_file_line_holds_the_passwords_hash_never_the_password() -> None:
    line = acl.acl_file_line("agent-w1", "agent", "s3cret", "w1")
    assert line.startswith("user agent-w1 on #") and "s3cret" not in line
    assert acl.password_sha256("s3cret") in line
    with pytest.raises(ValueError, match="not 'default'"):
        acl.acl_file_line("default", "edge", "s3cret")


def secret_file(tmp_path: Path, text: str, mode: int = 0o600) -> Path:
    path = tmp_path / "password"
    path.write_text(text + "\n")
    path.chmod(mode)
    return path


def test_the_password_file_goes_into_the_url_encoded_and_is_never_shown(
    tmp_path: Path,
) -> None:
    password = secret_file(tmp_path, "p@ss:w/rd")
    url = with_credentials("redis://edge@10.0.0.5:6380/0", password_file=password)
    assert url == "redis://edge:p%40ss%3Aw%2Frd@10.0.0.5:6380/0"
    assert shown(url) == "redis://edge:***@10.0.0.5:6380/0"
    assert where(url) == "10.0.0.5:6380" and user_of(url) == "edge"
    default = with_credentials("redis://10.0.0.5/0", password_file=password)
    assert user_of(default) == "default" and shown(default) == "redis://:***@10.0.0.5/0"
    assert shown("unix:///run/redis.sock?db=0&password=p%40ss") == \
        "unix:///run/redis.sock?db=0&password=***"
    assert shown("unix:///run/redis.sock") == "unix:///run/redis.sock"


def test_a_password_given_twice_a_shared_file_or_a_ca_without_tls_is_refused(
    tmp_path: Path,
) -> None:
    with pytest.raises(ValueError, match="give it once"):
        with_credentials("redis://edge:x@h/0", password_file=secret_file(tmp_path, "y"))
    with pytest.raises(ValueError, match="readable by others"):
        with_credentials("redis://h/0", password_file=secret_file(tmp_path, "y", 0o644))
    with pytest.raises(ValueError, match="rediss://"):
        with_credentials("redis://h/0", ca_file=secret_file(tmp_path, "ca"))
    tls = urlsplit(with_credentials("rediss://h/0", ca_file=tmp_path / "password"))
    assert parse_qs(tls.query) == {"ssl_ca_certs": [str(tmp_path / "password")]}


def test_the_store_password_file_goes_into_the_postgres_url(tmp_path: Path) -> None:
    password = secret_file(tmp_path, "p@ss")
    assert with_password("postgresql://thaw@db:5432/thaw", password) == \
        "postgresql://thaw:p%40ss@db:5432/thaw"
    assert with_password("postgresql://thaw@db:5432/thaw", None) == \
        "postgresql://thaw@db:5432/thaw"
    for url, why in (("sqlite", "postgresql:// store"), ("postgresql://db:5432/thaw", "no user"),
                     ("postgresql://thaw:x@db:5432/thaw", "give it once")):
        with pytest.raises(ValueError, match=why):
            with_password(url, password)
