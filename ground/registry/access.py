"""How a service reaches Redis: the URL with its credentials (a password file, a CA for
`rediss://`), the URL as shown (never the password), and the check each service makes
at start that Redis accepts its user.

A wrong password, a disabled user or one without its role's rights stops the service at
start with one line (`RegistryRefused`); a Redis that does not answer yet does not (the
registry is advisory: services start and catch up, see docs/registry.md).
"""

from __future__ import annotations

import logging
import ssl
from pathlib import Path
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit

from redis.exceptions import AuthenticationError, NoPermissionError, RedisError

from ground.auth.secrets_files import read_secret
from ground.registry import acl
from ground.registry.redis import connect

log = logging.getLogger("thaw.registry")

SCHEMES = ("redis", "rediss", "unix")
PASSWORD_FILE_ENV = "THAW_REGISTRY_PASSWORD_FILE"
CHECK_TIMEOUT_S = 2.0


class RegistryRefused(ValueError):
    """Redis refused this service's user (wrong password, disabled, too few rights), or
    its TLS certificate was not trusted."""


def with_credentials(url: str, *, password_file: Path | None = None,
                     ca_file: Path | None = None) -> str:
    """`url` with the password of `password_file` (a 0600 file) in its user part, and
    `ca_file` as the CA that a `rediss://` server's certificate must chain to. The user
    is the URL's (`redis://edge@host:6379/0`), else Redis's `default` user (requirepass).
    ValueError for a password given twice, or a CA without TLS."""
    parts = urlsplit(url)
    if parts.scheme not in SCHEMES:
        return url  # "memory", or an unknown scheme the registry factory refuses
    if password_file is not None:
        if parts.password is not None:
            raise ValueError("the registry's password is given both in the URL and in "
                             "--registry-password-file: give it once")
        password = read_secret(password_file)
        if not password:
            raise ValueError(f"{password_file} is empty")
        user = quote(unquote(parts.username or ""), safe="")
        where = parts.netloc.rpartition("@")[2]
        parts = parts._replace(netloc=f"{user}:{quote(password, safe='')}@{where}")
    if ca_file is not None:
        if parts.scheme != "rediss":
            raise ValueError("--registry-cacert is for a rediss:// (TLS) registry")
        if not ca_file.is_file():
            raise ValueError(f"--registry-cacert: {ca_file} is not a file")
        query = [(k, v) for k, v in parse_qsl(parts.query) if k != "ssl_ca_certs"]
        parts = parts._replace(query=urlencode([*query, ("ssl_ca_certs", str(ca_file))]))
    return parts.geturl()


def shown(url: str) -> str:
    """`url` fit to print: its password (in the user part or the query) replaced."""
    parts = urlsplit(url)
    if parts.password is not None:
        user, _, host = parts.netloc.rpartition("@")
        parts = parts._replace(netloc=f"{user.partition(':')[0]}:***@{host}")
    query = parse_qsl(parts.query)
    if any(k == "password" for k, _ in query):
        parts = parts._replace(query=urlencode(
            [(k, "***" if k == "password" else v) for k, v in query], safe="*/"))
    shown_url = parts.geturl()
    return shown_url.replace(":/", ":///", 1) if url.startswith("unix:///") else shown_url


def where(url: str) -> str:
    """HOST:PORT (or the socket path) of a Redis URL, for messages."""
    parts = urlsplit(url)
    if parts.scheme == "unix":
        return parts.path
    return f"{parts.hostname}:{parts.port or 6379}"


def user_of(url: str) -> str:
    return unquote(urlsplit(url).username or "") or "default"


async def check_access(url: str, role: str, worker: str = "") -> None:
    """Raise RegistryRefused unless Redis at `url` accepts its user for `role` (a PING,
    then HDELs that change nothing on keys the role writes); log and return when Redis
    does not answer."""
    if urlsplit(url).scheme not in SCHEMES:
        return
    client = connect(url, timeout_s=CHECK_TIMEOUT_S)
    refused = f"redis at {where(url)} refused user {user_of(url)!r}"
    try:
        await client.ping()
        for key, field in acl.probes(role, worker):
            await client.hdel(key, field)
    except NoPermissionError as exc:
        raise RegistryRefused(f"{refused}: NOPERM {exc} (is it the {role} role's user? "
                              "see thaw redis-acl)") from None
    except AuthenticationError as exc:
        why = str(exc) if urlsplit(url).password is not None else \
            "Redis asks for a password: give --registry-password-file (or one in the URL)"
        raise RegistryRefused(f"{refused}: {why}") from None
    except (RedisError, OSError) as exc:
        if _tls_failure(exc):
            raise RegistryRefused(f"redis at {where(url)}: TLS: {exc}") from None
        log.warning("redis at %s does not answer yet (%s); carrying on", where(url), exc)
    finally:
        await client.aclose()


def _tls_failure(exc: BaseException) -> bool:
    seen: BaseException | None = exc
    for _ in range(8):  # a chain of causes, however it was raised
        if seen is None or isinstance(seen, ssl.SSLError):
            return seen is not None
        seen = seen.__cause__ or seen.__context__
    return False
