"""An image's config over its base's, by Docker's rules. Pure: values in, documents out.

What a build sets (`ConfigChanges`) is laid over the base image's config:
Env is merged by name (the child wins, the base's order kept, new names after),
Labels by key, ExposedPorts are the union; WorkingDir, User and StopSignal are
inherited unless set. Entrypoint and Cmd follow Docker's rule: a child that
sets Entrypoint drops the base's Cmd unless it sets Cmd too. `None` always
means "not set here"; an empty list set on purpose (`CMD []`) is kept.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ConfigChanges:
    entrypoint: list[str] | None = None
    cmd: list[str] | None = None
    env: list[tuple[str, str]] = field(default_factory=list)  # in the order set; later wins
    workdir: str | None = None  # absolute
    user: str | None = None
    expose: list[str] = field(default_factory=list)  # "8080/tcp"
    stop_signal: str | None = None
    labels: dict[str, str] = field(default_factory=dict)


def merge_env(base: list[str], changes: list[tuple[str, str]]) -> list[str]:
    """Base "K=V" entries with `changes` applied: a known name keeps its place."""
    merged: dict[str, str] = {}
    for entry in base:
        key, _, value = entry.partition("=")
        merged[key] = value
    for key, value in changes:
        merged[key] = value
    return [f"{key}={value}" for key, value in merged.items()]


def entrypoint_and_cmd(
    base_entrypoint: list[str] | None,
    base_cmd: list[str] | None,
    entrypoint: list[str] | None,
    cmd: list[str] | None,
) -> tuple[list[str] | None, list[str] | None]:
    """Docker's rule: setting Entrypoint resets the inherited Cmd; a Cmd set here stays."""
    if entrypoint is not None:
        return entrypoint, cmd
    return base_entrypoint, cmd if cmd is not None else base_cmd


def merge_run_config(base: dict[str, Any], changes: ConfigChanges) -> dict[str, Any]:
    """The `config` object of the new image from the base's and the changes."""
    entrypoint, cmd = entrypoint_and_cmd(
        _argv_or_none(base.get("Entrypoint")), _argv_or_none(base.get("Cmd")),
        changes.entrypoint, changes.cmd)
    merged: dict[str, Any] = {
        "Env": merge_env([str(e) for e in base.get("Env") or []], changes.env),
    }
    if entrypoint is not None:
        merged["Entrypoint"] = entrypoint
    if cmd is not None:
        merged["Cmd"] = cmd
    for key, mine in (("WorkingDir", changes.workdir), ("User", changes.user),
                      ("StopSignal", changes.stop_signal)):
        chosen = mine if mine is not None else base.get(key)
        if chosen:
            merged[key] = chosen
    ports = {**(base.get("ExposedPorts") or {}), **{port: {} for port in changes.expose}}
    if ports:
        merged["ExposedPorts"] = dict(sorted(ports.items()))
    labels = {**(base.get("Labels") or {}), **changes.labels}
    if labels:
        merged["Labels"] = labels
    return merged


def _argv_or_none(value: Any) -> list[str] | None:
    return [str(v) for v in value] if isinstance(value, list) else None


def base_history(base_doc: dict[str, Any], base_layers: int, ref: str) -> list[dict[str, Any]]:
    """The base's history, or one entry per base layer when it kept none, so that the
    history's layer entries always match the layers (what the OCI spec asks)."""
    history = [h for h in base_doc.get("history") or [] if isinstance(h, dict)]
    with_layers = [h for h in history if not h.get("empty_layer")]
    if len(with_layers) == base_layers:
        return history
    return [{"created_by": f"layer {i + 1} of {ref}"} for i in range(base_layers)]


def image_config_doc(
    base_doc: dict[str, Any],
    changes: ConfigChanges,
    diff_ids: list[str],
    history: list[dict[str, Any]],
) -> dict[str, Any]:
    """The whole config blob: platform, merged run config, every layer's diff_id, history.

    `diff_ids` and `history` are the base's followed by this build's."""
    return {
        "architecture": base_doc.get("architecture") or "amd64",
        "os": base_doc.get("os") or "linux",
        "config": merge_run_config(base_doc.get("config") or {}, changes),
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
        "history": history,
    }


def expose_entry(port: str) -> str:
    """"8080" -> "8080/tcp"; "53/udp" kept; ValueError for anything else."""
    number, _, protocol = port.partition("/")
    protocol = (protocol or "tcp").lower()
    if not number.isdigit() or not 0 < int(number) < 65536 or protocol not in ("tcp", "udp"):
        raise ValueError(f"bad port {port!r}; expected PORT or PORT/tcp|udp")
    return f"{int(number)}/{protocol}"
