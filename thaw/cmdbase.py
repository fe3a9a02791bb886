"""What the app-owner and operator commands share: their common flags, the API client
they make from them, thaw.toml, `--set` pairs.

The API is `--api` (or $THAW_API_URL), else the context's (`--context NAME`, $THAW_CONTEXT,
else the `context` thaw.toml names, else the current one: thaw/contexts.py; `thaw up`
writes `local`), else 127.0.0.1:4280.
The token sent is `--token`, else $THAW_TOKEN, else — when no `--api` was given — the
context's token file, else the local platform's admin token (`./.thaw/admin.token`,
written by `thaw up`) — only for an API on this host. An https API's certificate is
checked against `--cacert`, else $THAW_CACERT, else the context's CA, else (an API on this
host) the local CA of `thaw up --tls` (`./.thaw/tls/ca.pem`) when there is one, else the
system's CAs. A context's token never goes to an `--api` given beside it.
"""

from __future__ import annotations

import argparse
import json
import tomllib
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from ground.appconfig import InvalidConfig
from thaw import contexts
from thaw.client import ApiClient

DEFAULT_API = "http://127.0.0.1:4280"
THAW_TOML = Path("thaw.toml")
LOCAL_TOKEN = Path(".thaw") / "admin.token"
LOCAL_CA = Path(".thaw") / "tls" / "ca.pem"
LOOPBACK = ("127.0.0.1", "localhost", "::1")

if TYPE_CHECKING:
    Sub = argparse._SubParsersAction[argparse.ArgumentParser]


def common_flags(env: Any) -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--api", default=env("API_URL", ""),
                        metavar="[http[s]://]HOST:PORT",
                        help="placement's API (default $THAW_API_URL, else the context's, "
                             "else 127.0.0.1:4280)")
    common.add_argument("--context", default=env("CONTEXT", ""), metavar="NAME",
                        help="the platform to talk to, by name (default $THAW_CONTEXT, else "
                             "the current one: `thaw context list`)")
    common.add_argument("--cacert", default=env("CACERT", ""), metavar="PATH",
                        help="the CA (PEM) an https API's certificate is checked against "
                             f"(default $THAW_CACERT, else ./{LOCAL_CA} for a local API, "
                             "else the system's CAs)")
    common.add_argument("--token", default=env("TOKEN", ""),
                        help=f"bearer token (default $THAW_TOKEN, else ./{LOCAL_TOKEN})")
    common.add_argument("--json", action="store_true",
                        help="print the API's answer as JSON (for scripts)")
    return common


def token_from(given: str, api: str) -> str:
    """`--token`/THAW_TOKEN, else the local platform's admin token — only for an API on
    this host: a remote `--api` never receives it."""
    if given:
        return given
    if urlsplit(api).hostname not in LOOPBACK:
        return ""
    try:
        return LOCAL_TOKEN.read_text().strip()
    except OSError:
        return ""


def cafile_from(given: str, api: str) -> str:
    """`--cacert`/THAW_CACERT, else the local CA of `thaw up --tls` for an API on this host
    (if there is one), else "" (the system's CAs)."""
    if given or urlsplit(api).hostname not in LOOPBACK or not LOCAL_CA.is_file():
        return given
    return str(LOCAL_CA)


def api_url(given: str) -> str:
    """`--api`: http(s)://host:port, or host:port (http:// is assumed)."""
    if "://" not in given:
        given = "http://" + given
    parts = urlsplit(given)
    wrong = ValueError(f"--api: expected host:port or http(s)://host:port, not {given!r}")
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise wrong
    try:
        parts.port  # noqa: B018 (a bad port raises here)
    except ValueError:
        raise wrong from None
    return given


def context_of(args: argparse.Namespace) -> contexts.Context | None:
    """The context a command talks to: none when `--api` is given; else `--context` (or
    $THAW_CONTEXT), else the one thaw.toml names, else the current one."""
    if args.api:
        return None
    return contexts.chosen(args.context or toml_context(getattr(args, "config", None)))


def toml_context(path: Path | None) -> str:
    """The `context` a thaw.toml names ("" for none, no file, or a file that is not TOML:
    the command reading it says so)."""
    path = path or THAW_TOML
    try:
        with open(path, "rb") as f:
            named = tomllib.load(f).get("context", "")
    except (OSError, tomllib.TOMLDecodeError):
        return ""
    if not isinstance(named, str):
        raise contexts.ContextError(f"{path}: context must be a context's name (a string)")
    return named


def url_of(args: argparse.Namespace, app: str) -> str:
    """Where the platform serves `app`, from the context's `app_url` ("" when not known)."""
    context = context_of(args)
    return contexts.app_url(context.app_url, app) if context and context.app_url else ""


def client_of(args: argparse.Namespace) -> ApiClient:
    context = context_of(args)
    api = api_url(args.api or (context.api if context is not None else DEFAULT_API))
    token = args.token or (context_token(context) if context is not None else "")
    cacert = args.cacert or (context.cacert if context is not None else "")
    return ApiClient(api, token_from(token, api), cafile=cafile_from(cacert, api))


def context_token(context: contexts.Context) -> str:
    if not context.token_file:
        return ""
    try:
        return Path(context.token_file).read_text().strip()
    except OSError as exc:
        raise contexts.ContextError(
            f"the context's token file {context.token_file}: {exc.strerror} (is its "
            "platform's state gone? `thaw context list`)") from None


def settings(pairs: list[str]) -> dict[str, Any]:
    """["concurrency.soft_limit=20", "auto_stop=stop"] -> nested dict (JSON values parsed)."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep:
            raise InvalidConfig(key, "expected FIELD=VALUE")
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        node = out
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return out


def load_thaw_toml(path: Path) -> dict[str, Any]:
    """thaw.toml: AppConfig fields at the top level; `app` is accepted for `name`."""
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise ValueError(f"no {path} here (pass -c PATH, or write one: thaw launch)") \
            from None
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{path}: not valid TOML: {exc}") from None
    return app_fields(data)


def app_fields(data: dict[str, Any]) -> dict[str, Any]:
    """thaw.toml's tables as AppConfig fields: `app` is accepted for `name`; `context`
    (the platform, for the CLI: `context_of`) and `[build]` (what deploy builds:
    thaw/appbuild.py) are not the app's."""
    if "app" in data:
        data["name"] = data.pop("app")
    data.pop("context", None)
    data.pop("build", None)
    return data


GONE = ("destroying", "destroyed")  # machine states that no longer count as the app's


def app_name(args: argparse.Namespace) -> str:
    """`-a APP`, else the `app` of ./thaw.toml (`-c PATH`), as flyctl does."""
    if args.app:
        return str(args.app)
    name = load_thaw_toml(args.config).get("name")
    if not isinstance(name, str) or not name:
        raise ValueError(f"{args.config} names no app: pass -a APP")
    return name


def add_app_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("-a", "--app", default="", help="the app (default: the app of thaw.toml)")
    p.add_argument("-c", "--config", type=Path, default=THAW_TOML,
                   help="the thaw.toml that names the app when -a is not given")
