"""Key and token files: read from the operator's file or environment, or made by `thaw up`.

Files the platform writes are created with mode 0600 before any byte goes in,
written to a temp name and renamed, so a half-written or world-readable secret
never exists.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Mapping
from pathlib import Path

from ground.auth.sealing import SecretKeys
from ground.auth.signing import NO_CLUSTER_KEY, KeyRing
from ground.auth.tickets import RouteKeys
from ground.auth.tokens import MIN_BOOTSTRAP_CHARS

CLUSTER_KEY_ENV = "THAW_CLUSTER_KEY"
ADMIN_TOKEN_ENV = "THAW_ADMIN_TOKEN"
CLUSTER_KEY_FILE = "cluster.key"
ADMIN_TOKEN_FILE = "admin.token"
SECRETS_KEY_FILE = "secrets.key"
ROUTE_KEY_FILE = "route.key"
ROUTE_KEY_ENV = "THAW_ROUTE_KEY_FILE"


def read_secret(path: Path) -> str:
    """A secret file's text; refuses files that others may read or write."""
    mode = path.stat().st_mode
    if mode & 0o077:
        raise ValueError(f"{path} is readable by others (mode {mode & 0o777:o}); chmod 600 it")
    return path.read_text().strip()


def cluster_keys(file: Path | None, env: Mapping[str, str] = os.environ) -> KeyRing:
    """The key ring from `--cluster-key-file`, else THAW_CLUSTER_KEY; ValueError if neither."""
    if file is not None:
        return KeyRing.parse(read_secret(file))
    text = env.get(CLUSTER_KEY_ENV, "")
    if not text:
        raise ValueError(NO_CLUSTER_KEY)
    return KeyRing.parse(text)


def secret_keys(file: Path | None) -> SecretKeys | None:
    """The secrets key ring from `--secrets-key-file` (None without one: apps' secrets
    are refused)."""
    return None if file is None else SecretKeys.parse(read_secret(file))


def route_keys(file: Path | None, env: Mapping[str, str] = os.environ) -> RouteKeys | None:
    """The route key ring from `--route-key-file`, else the file THAW_ROUTE_KEY_FILE names;
    None without either (machine records are then not verified)."""
    if file is None and env.get(ROUTE_KEY_ENV, "").strip():
        file = Path(env[ROUTE_KEY_ENV].strip())
    return None if file is None else RouteKeys.parse(read_secret(file))


def admin_token(file: Path | None, env: Mapping[str, str] = os.environ) -> str:
    """The bootstrap admin token from `--admin-token-file`, else THAW_ADMIN_TOKEN, else ""."""
    token = read_secret(file) if file is not None else env.get(ADMIN_TOKEN_ENV, "").strip()
    if token and len(token) < MIN_BOOTSTRAP_CHARS:
        raise ValueError(f"the admin token must have at least {MIN_BOOTSTRAP_CHARS} characters")
    return token


def ensure_secret(path: Path, nbytes: int = 32) -> str:
    """The secret in `path`, made (random, hex, mode 0600) when the file does not exist."""
    if path.exists():
        return read_secret(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    value = secrets.token_hex(nbytes)
    temp = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, value.encode() + b"\n")
        os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(temp, path)
    return value
