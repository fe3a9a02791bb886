"""AppConfig: what an app owner sets (API, CLI, thaw.toml), its bounds and its validation.

Decoding checks types and bounds (msgspec constraints, which the generated OpenAPI
document carries too); `check` adds the rules between fields and normalises routed
host names. Every rejection names the field, so the API can answer 422 with it.
Every number has an upper bound: a config either passes and stays within them, or
is refused — nothing accepted can stall something later.
"""

from __future__ import annotations

import difflib
import re
import signal
from typing import Annotated, Any, Literal, TypeVar, get_args

import msgspec
import msgspec.inspect

from ground.hostnames import BadHost, normalize_host
from ground.imageref import BadReference, parse_reference

APP_NAME_PATTERN = r"^[a-z](?:[a-z0-9-]{0,61}[a-z0-9])?$"  # one DNS label: {app}.{domain}
APP_NAME = re.compile(APP_NAME_PATTERN)
T = TypeVar("T")
MAX_ENV_BYTES = 64 * 1024
RESERVED_ENV = frozenset({"PORT", "HOSTNAME"})  # set by the agent; THAW_* too
MAX_SECRETS = 100  # per app
HOUR_S = 3600.0

AppName = Annotated[str, msgspec.Meta(pattern=APP_NAME_PATTERN)]
REGION_PATTERN = r"[a-z0-9](?:[a-z0-9-]{0,30}[a-z0-9])?"
Region = Annotated[str, msgspec.Meta(pattern=f"^{REGION_PATTERN}$")]
RegionOrPrimary = Annotated[str, msgspec.Meta(pattern=f"^(?:{REGION_PATTERN})?$")]  # "": primary
ENV_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]{0,127}$"
EnvName = Annotated[str, msgspec.Meta(pattern=ENV_NAME_PATTERN)]
EnvValue = Annotated[str, msgspec.Meta(max_length=MAX_ENV_BYTES)]
SecretDigest = Annotated[str, msgspec.Meta(pattern=r"^[0-9a-f]{12}$")]
HostName = Annotated[str, msgspec.Meta(min_length=1, max_length=254)]
# Durations: at least a millisecond (what a wake's deadline can carry), at most an hour.
MIN_S = 0.001
Seconds = Annotated[float, msgspec.Meta(ge=MIN_S, le=HOUR_S)]
Machines = Annotated[int, msgspec.Meta(ge=0, le=1000)]
Requests = Annotated[int, msgspec.Meta(ge=1, le=10_000)]
MAX_ARGS = 256
Arg = Annotated[str, msgspec.Meta(max_length=4096)]


class InvalidConfig(ValueError):
    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


class GuestConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    cpus: Annotated[float, msgspec.Meta(ge=0.01, le=64)] = 1.0
    memory_mb: Annotated[int, msgspec.Meta(ge=1, le=262_144)] = 256


class Concurrency(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    type: Literal["requests", "connections"] = "requests"
    soft_limit: Requests = 20
    hard_limit: Requests = 25


class HealthConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    # "": ready when the port accepts a TCP connection; else an origin-form path, no spaces
    path: Annotated[str, msgspec.Meta(max_length=1024, pattern=r"^(/[\x21-\x7e]*)?$")] = ""
    interval_s: Seconds = 10.0
    timeout_s: Seconds = 30.0  # start-to-ready budget
    grace_s: Annotated[float, msgspec.Meta(ge=0, le=HOUR_S)] = 1.0


# How a deploy replaces machines — rolling: one replacement (or max_unavailable) at a
# time, each healthy before the old one goes; immediate: all at once; canary: one, then
# the rest once it is healthy. The one definition: the API, the CLI and the reconciler's
# core take it from here.
Strategy = Literal["rolling", "immediate", "canary"]
STRATEGIES: tuple[Strategy, ...] = get_args(Strategy)


class DeployConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    strategy: Strategy = "rolling"
    max_unavailable: Annotated[int, msgspec.Meta(ge=1, le=100)] = 1


class AppConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    name: AppName
    image: Annotated[str, msgspec.Meta(min_length=1, max_length=1024)]
    regions: Annotated[list[Region], msgspec.Meta(min_length=1, max_length=16)] = (
        msgspec.field(default_factory=lambda: ["local"]))
    guest: GuestConfig = GuestConfig()
    # the port the app listens on (PORT says it too); 0: the image's one ExposedPort, else
    # 8080. Under the bubblewrap driver machines share the host's network: the app must
    # listen on $PORT there (docs/process-driver.md).
    port: Annotated[int, msgspec.Meta(ge=0, le=65_535)] = 0
    # how the edge speaks to the app's machines: HTTP/1.1, or HTTP/2 with prior knowledge
    # ("h2c": gRPC servers — grpcio, tonic, grpc-go — speak nothing else)
    protocol: Literal["http1", "h2c"] = "http1"
    # the image's Entrypoint and Cmd, overridden (empty: the image's): a new entrypoint
    # drops the image's Cmd unless cmd is given too (Kubernetes' command and args)
    entrypoint: Annotated[list[Arg], msgspec.Meta(max_length=MAX_ARGS)] = (
        msgspec.field(default_factory=list))
    cmd: Annotated[list[Arg], msgspec.Meta(max_length=MAX_ARGS)] = (
        msgspec.field(default_factory=list))
    env: Annotated[dict[EnvName, EnvValue], msgspec.Meta(max_length=128)] = (
        msgspec.field(default_factory=dict))
    # the app's secrets: names and digests, never values (placement's own: set through
    # /v1/apps/{app}/secrets; a change is a new release, like env's)
    secrets: Annotated[dict[EnvName, SecretDigest], msgspec.Meta(max_length=MAX_SECRETS)] = (
        msgspec.field(default_factory=dict))
    # extra Host names routed here (normalised; never under the platform's domain)
    hosts: Annotated[list[HostName], msgspec.Meta(max_length=32)] = (
        msgspec.field(default_factory=list))
    min_machines_running: Machines = 0
    max_machines: Annotated[int, msgspec.Meta(ge=1, le=1000)] = 3
    concurrency: Concurrency = Concurrency()
    auto_stop: Literal["off", "stop", "suspend"] = "stop"
    auto_start: bool = True
    idle_timeout_s: Annotated[float, msgspec.Meta(ge=MIN_S, le=24 * HOUR_S)] = 300.0
    hold_timeout_s: Seconds = 30.0
    max_pending: Annotated[int, msgspec.Meta(ge=0, le=100_000)] = 1000
    spares: Annotated[int, msgspec.Meta(ge=0, le=100)] = 0
    health: HealthConfig = HealthConfig()
    kill_signal: Annotated[str, msgspec.Meta(max_length=16)] = ""  # "": the image's StopSignal
    kill_timeout_s: Annotated[float, msgspec.Meta(ge=MIN_S, le=300)] = 5.0
    deploy: DeployConfig = DeployConfig()
    # pinned at create and deploy; "" only before the first resolution
    image_digest: Annotated[str, msgspec.Meta(pattern=r"^(sha256:[0-9a-f]{64})?$")] = ""
    version: Annotated[int, msgspec.Meta(ge=0, le=2**53)] = 0  # bumped on every stored change
    # this incarnation of the name: set at create, never changed (a new app of a deleted
    # app's name is another app, and nothing of the old one is its)
    uid: Annotated[str, msgspec.Meta(pattern=r"^([0-9a-f]{16})?$")] = ""
    # the release machines are to run (placement's; 0 before the app's first release)
    release: Annotated[int, msgspec.Meta(ge=0, le=2**53)] = 0


def release_of(release: int, image_digest: str, config: AppConfig) -> int:
    """The release a machine (made for `release`, running `image_digest`) counts as: one
    made before releases existed (0) counts as the app's current release while it runs
    the app's image."""
    if release == 0 and image_digest in ("", config.image_digest):
        return config.release
    return release


# What a machine is made from: a change of any of these is a new release.
MACHINE_FIELDS = ("image", "image_digest", "env", "secrets", "guest", "port", "entrypoint",
                  "cmd", "health", "kill_signal", "kill_timeout_s")
# What a rollback (or a failed release) takes from an earlier release: secrets are not
# versioned (placement keeps only their current values), so they stay as they are.
ROLLBACK_FIELDS = tuple(name for name in MACHINE_FIELDS if name != "secrets")


def machine_spec(config: AppConfig) -> tuple[object, ...]:
    """The part of the config its machines are made from (see MACHINE_FIELDS)."""
    return tuple(getattr(config, name) for name in MACHINE_FIELDS)


def check(config: AppConfig) -> AppConfig:
    """Rules between fields; raises InvalidConfig naming the first bad field. Returns the
    config with its host names normalised."""
    try:
        parse_reference(config.image)
    except BadReference as exc:
        raise InvalidConfig("image", exc.message) from None
    if config.max_machines < config.min_machines_running:
        raise InvalidConfig("max_machines", "must be >= max(1, min_machines_running)")
    if config.concurrency.hard_limit < config.concurrency.soft_limit:
        raise InvalidConfig("concurrency.hard_limit", "must be >= concurrency.soft_limit")
    if config.kill_signal and config.kill_signal not in signal.Signals.__members__:
        raise InvalidConfig("kill_signal", f"{config.kill_signal!r} is not a signal name")
    for name in ("entrypoint", "cmd"):
        if any("\0" in arg for arg in getattr(config, name)):
            raise InvalidConfig(name, "an argument cannot contain a NUL byte")
    _check_env(config.env)
    shared = sorted(set(config.env) & set(config.secrets))
    if shared:
        raise InvalidConfig("env", f"{shared[0]} is a secret of the app: unset the secret "
                                   f"first (thaw secrets unset)")
    hosts = _normalised_hosts(config.hosts)
    return config if hosts == config.hosts else msgspec.structs.replace(config, hosts=hosts)


def _check_env(env: dict[str, str]) -> None:
    for name, value in env.items():
        if name in RESERVED_ENV or name.startswith("THAW_"):
            raise InvalidConfig("env", f"{name} is set by the platform")
        if "\0" in value:
            raise InvalidConfig("env", f"{name}: a value cannot contain a NUL byte")
    size = sum(len(k.encode()) + len(v.encode()) for k, v in env.items())
    if size > MAX_ENV_BYTES:
        raise InvalidConfig("env", f"{size} bytes of names and values; at most {MAX_ENV_BYTES}")


def _normalised_hosts(hosts: list[str]) -> list[str]:
    out: list[str] = []
    for host in hosts:
        try:
            name = normalize_host(host)
        except BadHost as exc:
            raise InvalidConfig("hosts", str(exc)) from None
        if name not in out:
            out.append(name)
    return out


def decoded(data: bytes | dict[str, Any], kind: type[T]) -> T:
    """JSON bytes or a dict as `kind`; InvalidConfig naming the field (or `body`) for
    anything that is not one — wrong types, bounds, bad JSON, deep nesting, bad UTF-8."""
    try:
        if isinstance(data, bytes | bytearray):
            return msgspec.json.decode(data, type=kind)
        return msgspec.convert(data, type=kind)
    except msgspec.ValidationError as exc:
        message = str(exc)
        raise InvalidConfig(field_of(message), plain(message, allowed(message, kind))
                            + did_you_mean(message, kind)) from None
    except msgspec.DecodeError as exc:
        raise InvalidConfig("body", f"not valid JSON: {exc}") from None
    except RecursionError:
        raise InvalidConfig("body", "nested too deeply") from None
    except UnicodeDecodeError:
        raise InvalidConfig("body", "not valid UTF-8") from None


def parse(data: bytes | dict[str, Any]) -> AppConfig:
    """JSON bytes or a dict (e.g. from thaw.toml) -> a checked AppConfig."""
    return check(decoded(data, AppConfig))


def patched(config: AppConfig, patch: dict[str, Any]) -> AppConfig:
    """Apply a JSON merge patch (RFC 7396) of an app's fields; the name cannot change."""
    if "name" in patch and patch["name"] != config.name:
        raise InvalidConfig("name", "cannot be changed")
    merged = _merge(msgspec.to_builtins(config), patch)
    return parse(merged)


def _merge(base: Any, patch: Any) -> Any:
    if not isinstance(patch, dict) or not isinstance(base, dict):
        return patch
    out = dict(base)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = _merge(base.get(key), value)
    return out


KINDS = {"int": "an integer", "float": "a number", "str": "a string", "bool": "true or false",
         "array": "a list", "object": "a table", "null": "null"}
COUNTED = {"str": "characters", "bytes": "bytes", "array": "items", "object": "entries"}
_BOUND = re.compile(r"Expected `(\w+)` (>=|<=|>|<) (\S+)$")
_LENGTH = re.compile(r"Expected `(\w+)` of length (>=|<=) (\d+)$")
_TYPE = re.compile(r"Expected `([^`]+)`, got `(\w+)`$")
_PATTERN = re.compile(r"Expected `str` matching regex '(.*)'$")
_ENUM = re.compile(r"Invalid enum value (.*)$")
_WORDS = {">=": "at least", "<=": "at most", ">": "more than", "<": "less than"}


def plain(message: str, values: tuple[object, ...] = ()) -> str:
    """msgspec's message about one field as an owner reads it, its path left out (the
    field is named beside it): "Expected `int` >= 1 - at `$.max_machines`" -> "must be at
    least 1"; a message it does not know stays as it is."""
    text = re.sub(r" - at `\$[^`]*`$", "", message)
    if bound := _BOUND.match(text):
        return f"must be {_WORDS[bound.group(2)]} {bound.group(3)}"
    if length := _LENGTH.match(text):
        unit = COUNTED.get(length.group(1), "long")
        return f"must be {_WORDS[length.group(2)]} {length.group(3)} {unit}"
    if wrong := _TYPE.match(text):
        wanted = " or ".join(KINDS.get(k.strip(), k.strip())
                             for k in wrong.group(1).split("|"))
        return f"must be {wanted}, not {KINDS.get(wrong.group(2), wrong.group(2))}"
    if pattern := _PATTERN.match(text):
        return f"must match {pattern.group(1)}"
    if enum := _ENUM.match(text):
        if values:
            return f"must be one of {', '.join(str(v) for v in values)}, not {enum.group(1)}"
        return f"{enum.group(1)} is not one of the values it may take"
    if text.startswith("Object contains unknown field"):
        return "is not a field here"
    if text.startswith("Object missing required field"):
        return "is required"
    return text


def allowed(message: str, kind: Any) -> tuple[object, ...]:
    """The values the field a msgspec error names may take, when it is a `Literal`
    (() for any other field)."""
    at = re.search(r" - at `\$((?:\.\w+)*)`$", message)
    info = _type_at(kind, at.group(1)) if at is not None else None
    return tuple(getattr(info, "values", ()))


def _type_at(kind: Any, path: str) -> Any:
    """msgspec's type info of the field at `path` (".guest.cpus"; "" : `kind` itself),
    None when no field is there."""
    info: Any = msgspec.inspect.type_info(kind)
    for part in filter(None, path.split(".")):
        info = {f.name: f.type for f in getattr(info, "fields", ())}.get(part)
        if info is None:
            return None
    return info


def did_you_mean(message: str, kind: Any) -> str:
    """For msgspec's "unknown field `imgae` - at `$.guest`": "; did you mean `image`?"
    naming the closest field of the struct at that path ("" when none is close)."""
    found = re.match(r"Object contains unknown field `(.*?)`(?: - at `\$((?:\.\w+)*)`)?$",
                     message)  # (a name may hold a backtick: the shortest that ends the line)
    if found is None:
        return ""
    info = _type_at(kind, found.group(2) or "")
    names = [f.name for f in getattr(info, "fields", ())]
    close = [n for n in names if n.startswith(found.group(1))] or difflib.get_close_matches(
        found.group(1), names, n=1, cutoff=0.6)
    return f"; did you mean `{close[0]}`?" if close else ""


def field_of(message: str) -> str:
    """The field a msgspec error names: "... - at `$.a.b`", "... in `$.env`" or
    "... required field `image`"; an unknown field is named with its path."""
    unknown = re.match(r"Object contains unknown field `(.*?)`(?: - at `\$\.([^`]+)`)?$",
                       message)  # (a name may hold a backtick: the shortest that ends the line)
    if unknown:
        return f"{unknown.group(2)}.{unknown.group(1)}" if unknown.group(2) else unknown.group(1)
    at = re.search(r"`\$\.([^`]+)`", message)
    if at:
        return re.sub(r"\[[^\]]*\]", "", at.group(1))
    named = re.search(r"field `([^`]+)`", message)
    return named.group(1) if named else "body"
