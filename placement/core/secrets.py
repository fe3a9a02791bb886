"""What a change of an app's secrets makes: the values to write and the names to drop.

Invariants of an app's secrets after any change: at most MAX_SECRETS, names are env
names and none is the platform's (`PORT`, `THAW_*`) or a name of the app's plain env
(one name, one source: a secret never silently shadows config, nor config a secret);
a value has at most MAX_SECRET_VALUE_BYTES and no NUL byte; all names and values at
most MAX_SECRETS_BYTES. Setting a secret to the value it has is no change. It must not
know keys, ciphertexts, stores or HTTP.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ground.appconfig import MAX_SECRETS, RESERVED_ENV, InvalidConfig

MAX_SECRET_VALUE_BYTES = 32 * 1024  # one secret's value (UTF-8)
MAX_SECRETS_BYTES = 64 * 1024  # all of an app's secrets' names and values


class UnknownSecret(KeyError):
    """A name to unset that is not one of the app's secrets."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


@dataclass(frozen=True)
class SecretsPlan:
    put: dict[str, str]  # name -> new value (new names, or a value that differs)
    drop: tuple[str, ...]  # names removed

    @property
    def changed(self) -> bool:
        return bool(self.put or self.drop)


def plan_secrets(current: Mapping[str, str], put: Mapping[str, str], unset: Sequence[str],
                 env: Mapping[str, str]) -> SecretsPlan:
    """The change from `current` (name -> value) setting `put` and removing `unset`;
    InvalidConfig naming the field (`secrets` or `unset`) for a refused one, UnknownSecret
    for a name to unset the app does not have."""
    for name in unset:
        if name in put:
            raise InvalidConfig("unset", f"{name} is also set in the same change")
        if name not in current:
            raise UnknownSecret(name)
    for name, value in put.items():
        _check(name, value, env)
    after = {k: v for k, v in current.items() if k not in unset} | dict(put)
    if len(after) > MAX_SECRETS:
        raise InvalidConfig("secrets", f"{len(after)} secrets; an app has at most "
                                       f"{MAX_SECRETS}")
    size = sum(len(k.encode()) + len(v.encode()) for k, v in after.items())
    if size > MAX_SECRETS_BYTES:
        raise InvalidConfig("secrets", f"{size} bytes of names and values; at most "
                                       f"{MAX_SECRETS_BYTES}")
    return SecretsPlan(put={k: v for k, v in put.items() if current.get(k) != v},
                       drop=tuple(dict.fromkeys(unset)))


# Names the loader and the runtime read before the app does: set as secrets (which a
# rollback does not restore), a bad value makes every machine fail to start with no
# release to go back to; they belong in env, versioned with releases.
RUNTIME_NAMES = frozenset({"PATH", "HOME", "SHELL", "IFS"})


def _check(name: str, value: str, env: Mapping[str, str]) -> None:
    if name in RESERVED_ENV or name.startswith("THAW_"):
        raise InvalidConfig("secrets", f"{name} is set by the platform")
    if name in RUNTIME_NAMES or name.startswith(("LD_", "PYTHON")):
        raise InvalidConfig("secrets", f"{name} is read by the runtime before the app: set "
                                       f"it in env (a release restores it), not as a secret")
    if name in env:
        raise InvalidConfig("secrets", f"{name} is in the app's env: remove it there first "
                                       f"(one name, one source)")
    if "\0" in value:
        raise InvalidConfig("secrets", f"{name}: a value cannot contain a NUL byte")
    if len(value.encode()) > MAX_SECRET_VALUE_BYTES:
        raise InvalidConfig("secrets", f"{name}: a value has at most "
                                       f"{MAX_SECRET_VALUE_BYTES} bytes")
