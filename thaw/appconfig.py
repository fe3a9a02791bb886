"""AppConfig: what an app owner sets (API, CLI, thaw.toml), and its validation.

Decoding checks types (msgspec); `check` adds the rules between fields. Every
rejection names the field, so the API can answer 422 with it.
"""

from __future__ import annotations

import re
import signal
from typing import Any, Literal

import msgspec

APP_NAME = re.compile(r"^[a-z][a-z0-9-]{0,62}$")


class InvalidConfig(ValueError):
    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


class GuestConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    cpus: float = 1.0
    memory_mb: int = 256


class Concurrency(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    type: Literal["requests", "connections"] = "requests"
    soft_limit: int = 20
    hard_limit: int = 25


class HealthConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    path: str = ""  # "": ready when the port accepts a TCP connection
    interval_s: float = 10.0
    timeout_s: float = 30.0  # start-to-ready budget
    grace_s: float = 1.0


class AppConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    name: str
    image: str
    regions: list[str] = msgspec.field(default_factory=lambda: ["local"])
    guest: GuestConfig = GuestConfig()
    port: int = 8080  # informational: the agent sets $PORT, which the app must honour
    env: dict[str, str] = msgspec.field(default_factory=dict)
    hosts: list[str] = msgspec.field(default_factory=list)  # extra Host names routed here
    min_machines_running: int = 0
    max_machines: int = 3
    concurrency: Concurrency = Concurrency()
    auto_stop: Literal["off", "stop", "suspend"] = "stop"
    auto_start: bool = True
    idle_timeout_s: float = 300.0
    hold_timeout_s: float = 30.0
    max_pending: int = 1000
    spares: int = 0
    health: HealthConfig = HealthConfig()
    kill_signal: str = "SIGTERM"
    kill_timeout_s: float = 5.0
    image_digest: str = ""  # pinned at deploy; "" until the first deploy
    version: int = 0  # bumped on every stored change


def _positive(field: str, value: float) -> None:
    if value <= 0:
        raise InvalidConfig(field, "must be > 0")


def check(config: AppConfig) -> AppConfig:
    """Rules between fields; raises InvalidConfig naming the first bad field."""
    if not APP_NAME.match(config.name):
        raise InvalidConfig("name", "lowercase letters, digits and '-', starting with a letter")
    if not config.image:
        raise InvalidConfig("image", "must not be empty")
    if not config.regions or any(not r for r in config.regions):
        raise InvalidConfig("regions", "at least one non-empty region")
    _positive("guest.cpus", config.guest.cpus)
    _positive("guest.memory_mb", config.guest.memory_mb)
    if not 0 < config.port < 65536:
        raise InvalidConfig("port", "must be in 1..65535")
    if config.min_machines_running < 0:
        raise InvalidConfig("min_machines_running", "must be >= 0")
    if config.max_machines < max(1, config.min_machines_running):
        raise InvalidConfig("max_machines", "must be >= max(1, min_machines_running)")
    _positive("concurrency.soft_limit", config.concurrency.soft_limit)
    if config.concurrency.hard_limit < config.concurrency.soft_limit:
        raise InvalidConfig("concurrency.hard_limit", "must be >= concurrency.soft_limit")
    for name in ("idle_timeout_s", "hold_timeout_s", "kill_timeout_s"):
        _positive(name, getattr(config, name))
    if config.max_pending < 0:
        raise InvalidConfig("max_pending", "must be >= 0")
    if config.spares < 0:
        raise InvalidConfig("spares", "must be >= 0")
    _positive("health.timeout_s", config.health.timeout_s)
    _positive("health.interval_s", config.health.interval_s)
    if config.health.path and not config.health.path.startswith("/"):
        raise InvalidConfig("health.path", "must start with '/'")
    if config.kill_signal not in signal.Signals.__members__:
        raise InvalidConfig("kill_signal", f"{config.kill_signal!r} is not a signal name")
    return config


def parse(data: bytes | dict[str, Any]) -> AppConfig:
    """JSON bytes or a dict (e.g. from thaw.toml) -> a checked AppConfig."""
    try:
        if isinstance(data, bytes | bytearray):
            config = msgspec.json.decode(data, type=AppConfig)
        else:
            config = msgspec.convert(data, type=AppConfig)
    except msgspec.ValidationError as exc:
        raise InvalidConfig(_field_of(str(exc)), str(exc)) from None
    except msgspec.DecodeError as exc:
        raise InvalidConfig("body", f"not valid JSON: {exc}") from None
    return check(config)


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


def _field_of(message: str) -> str:
    """The field a msgspec error names: "... - at `$.a.b`" or "... required field `image`"."""
    at = re.search(r"at `\$\.([^`]+)`", message)
    if at:
        return re.sub(r"\[\d+\]", "", at.group(1))
    named = re.search(r"field `([^`]+)`", message)
    return named.group(1) if named else "body"
