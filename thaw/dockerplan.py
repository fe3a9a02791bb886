"""A Dockerfile's instructions to a build plan: its base, its layers, its config changes. Pure.

One stage: ARGs, then FROM, then COPY/ADD, ENV, ARG, WORKDIR, USER, EXPOSE,
ENTRYPOINT, CMD, LABEL, STOPSIGNAL, SHELL and MAINTAINER with Docker's meaning.
Each COPY or ADD is one layer; a WORKDIR's directory goes into the next one
(or a last layer of its own when no copy follows) so that it exists in the
image. Variables are substituted where Docker substitutes them (not in CMD or
ENTRYPOINT): ENV wins over ARG, a global ARG reaches past FROM only when
declared again, `--build-arg` wins over an ARG's default. What needs a
container (RUN), a second stage, or a feature thaw has elsewhere is refused
with the line it is on.
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from thaw.dockerfile import (
    DockerfileError,
    Instruction,
    exec_form,
    expand,
    pairs,
    split_words,
)
from thaw.imageconfig import ConfigChanges, expose_entry

_REFUSED = {
    "RUN": "RUN needs a container to run in; not supported by thaw image build yet",
    "HEALTHCHECK": "HEALTHCHECK is not supported: thaw checks health by thaw.toml's [health]",
    "VOLUME": "VOLUME is not supported: thaw machines have no volumes",
    "ONBUILD": "ONBUILD is not supported by thaw image build",
}
_COPY_FLAGS = frozenset({"chown", "chmod", "link"})


@dataclass(frozen=True)
class CopyStep:
    line: int
    sources: list[str]
    dest: str  # absolute; a trailing "/" kept (it means "into")
    chown: str | None
    chmod: int | None
    add: bool


@dataclass
class LayerPlan:
    copies: list[CopyStep] = field(default_factory=list)
    dirs: list[str] = field(default_factory=list)  # absolute, from WORKDIR


@dataclass(frozen=True)
class HistoryStep:
    created_by: str
    layer: bool


@dataclass
class DockerfilePlan:
    base: str
    layers: list[LayerPlan] = field(default_factory=list)
    history: list[HistoryStep] = field(default_factory=list)
    changes: ConfigChanges = field(default_factory=ConfigChanges)
    unused_build_args: list[str] = field(default_factory=list)


@dataclass
class _State:
    """What the instructions so far have set."""

    args: dict[str, str]
    env: dict[str, str]
    changes: ConfigChanges
    workdir: str
    shell: list[str] = field(default_factory=lambda: ["/bin/sh", "-c"])
    pending_dirs: list[str] = field(default_factory=list)

    @property
    def scope(self) -> dict[str, str]:
        return {**self.args, **self.env}


def plan_dockerfile(
    instructions: list[Instruction],
    build_args: dict[str, str],
    base_config: Callable[[str], dict[str, Any]],
) -> DockerfilePlan:
    """The plan; `base_config(ref)` gives the base's run config (its Env and WorkingDir
    are in scope for substitution). DockerfileError names the line of any refusal."""
    global_args, index = _global_args(instructions, build_args)
    if index == len(instructions):
        raise DockerfileError(0, "no FROM instruction (use FROM scratch for an empty base)")
    base = _from(instructions[index], global_args)
    config = base_config(base)
    env = {key: value for key, _, value in (str(e).partition("=") for e in config.get("Env") or [])}
    state = _State({}, env, ConfigChanges(), str(config.get("WorkingDir") or "/"))
    plan = DockerfilePlan(base)
    declared = set(global_args)
    for item in instructions[index + 1 :]:
        try:
            _apply(item, state, plan, global_args, build_args, declared)
        except ValueError as exc:
            if isinstance(exc, DockerfileError):
                raise
            raise DockerfileError(item.line, f"{item.keyword}: {exc}") from None
    if state.pending_dirs:
        plan.layers.append(LayerPlan(dirs=state.pending_dirs))
        plan.history.append(HistoryStep(f"WORKDIR {' '.join(state.pending_dirs)} (mkdir)", True))
    plan.changes = state.changes
    plan.unused_build_args = sorted(set(build_args) - declared)
    return plan


def _global_args(
    instructions: list[Instruction], build_args: dict[str, str]
) -> tuple[dict[str, str], int]:
    """ARGs before FROM (only FROM may use them) and the index of FROM."""
    found: dict[str, str] = {}
    for index, item in enumerate(instructions):
        if item.keyword == "FROM":
            return found, index
        if item.keyword != "ARG":
            raise DockerfileError(item.line, f"{item.keyword} before FROM")
        for name, default in _arg_words(item, found):
            value = build_args.get(name, default)
            if value is not None:
                found[name] = value
    return found, len(instructions)


def _arg_words(item: Instruction, scope: dict[str, str]) -> list[tuple[str, str | None]]:
    declared: list[tuple[str, str | None]] = []
    for word in split_words(item.args):
        name, sep, default = word.partition("=")
        if not name:
            raise DockerfileError(item.line, f"ARG wants NAME[=DEFAULT], got {word!r}")
        declared.append((name, expand(default, scope) if sep else None))
    if not declared:
        raise DockerfileError(item.line, "ARG wants a name")
    return declared


def _from(item: Instruction, args: dict[str, str]) -> str:
    words = split_words(item.args)
    while words and words[0].startswith("--"):
        flag = expand(words.pop(0), args)
        if flag not in ("--platform=linux/amd64", "--platform=linux"):
            raise DockerfileError(item.line, f"FROM {flag} is not supported (linux/amd64 only)")
    if len(words) not in (1, 3) or (len(words) == 3 and words[1].lower() != "as"):
        raise DockerfileError(item.line, "FROM wants IMAGE [AS NAME]")
    ref = expand(words[0], args)
    if not ref:
        raise DockerfileError(item.line, f"FROM {words[0]} is empty (an ARG not given?)")
    return ref


def _apply(item: Instruction, state: _State, plan: DockerfilePlan,
           global_args: dict[str, str], build_args: dict[str, str], declared: set[str]) -> None:
    keyword = item.keyword
    if keyword in _REFUSED:
        raise DockerfileError(item.line, _REFUSED[keyword])
    if keyword == "FROM":
        raise DockerfileError(item.line, "a second FROM: multi-stage builds are not supported")
    if keyword in ("COPY", "ADD"):
        step = _copy(item, state)
        plan.layers.append(LayerPlan([step], state.pending_dirs))
        state.pending_dirs = []
        plan.history.append(HistoryStep(f"{keyword} {item.args}", True))
        return
    if keyword == "ARG":
        for name, default in _arg_words(item, state.scope):
            declared.add(name)
            value = build_args.get(name, default if default is not None
                                   else global_args.get(name))
            if value is not None:
                state.args[name] = value
    else:
        handler = _SETTERS.get(keyword)
        if handler is None:
            raise DockerfileError(item.line, f"unknown instruction {keyword}")
        handler(item, state)
    plan.history.append(HistoryStep(f"{keyword} {item.args}", False))


def _copy(item: Instruction, state: _State) -> CopyStep:
    listed = exec_form(item.args)
    words = listed if listed is not None else split_words(item.args)
    flags: dict[str, str] = {}
    while words and words[0].startswith("--"):
        name, _, value = words.pop(0)[2:].partition("=")
        if name == "from":
            raise DockerfileError(item.line, f"{item.keyword} --from: multi-stage builds are "
                                             "not supported")
        if name not in _COPY_FLAGS:
            raise DockerfileError(item.line, f"{item.keyword} --{name} is not supported")
        flags[name] = expand(value, state.scope)
    paths = [expand(w, state.scope) for w in words]
    if len(paths) < 2:
        raise DockerfileError(item.line, f"{item.keyword} wants SOURCE... DEST")
    if item.keyword == "ADD":
        _refuse_remote(item, paths[:-1])
    return CopyStep(item.line, paths[:-1], _absolute(paths[-1], state.workdir, keep_slash=True),
                    flags.get("chown") or None, _mode(item, flags.get("chmod")),
                    item.keyword == "ADD")


def _refuse_remote(item: Instruction, sources: list[str]) -> None:
    for source in sources:
        if "://" in source or source.startswith("git@"):
            raise DockerfileError(item.line, f"ADD {source}: URLs are not supported; download "
                                             "it into the build context and COPY it")


def _mode(item: Instruction, text: str | None) -> int | None:
    if not text:
        return None
    try:
        mode = int(text, 8)
    except ValueError:
        raise DockerfileError(item.line, f"--chmod={text}: octal modes only") from None
    if mode & ~0o1777:
        raise DockerfileError(item.line, f"--chmod={text}: no setuid, setgid or type bits")
    return mode


def _absolute(path: str, workdir: str, *, keep_slash: bool = False) -> str:
    joined = posixpath.normpath(posixpath.join(workdir, path))
    slash = keep_slash and (path.endswith("/") or path in (".", "./")) and joined != "/"
    return joined + "/" if slash else joined


def _replace(state: _State, **changed: Any) -> None:
    state.changes = replace(state.changes, **changed)


def _env(item: Instruction, state: _State) -> None:
    words = split_words(item.args)
    if words and "=" not in words[0]:  # the old form: ENV NAME the rest of the line
        name, _, rest = item.args.partition(" ")
        found = [(name, expand(rest.strip(), state.scope))]
    else:
        found = pairs(words, state.scope, "ENV")
    if not found:
        raise ValueError("ENV wants NAME=VALUE")
    state.env.update(found)
    _replace(state, env=[*state.changes.env, *found])


def _label(item: Instruction, state: _State) -> None:
    found = pairs(split_words(item.args), state.scope, "LABEL")
    _replace(state, labels={**state.changes.labels, **dict(found)})


def _maintainer(item: Instruction, state: _State) -> None:
    _replace(state, labels={**state.changes.labels, "maintainer": item.args})


def _workdir(item: Instruction, state: _State) -> None:
    state.workdir = _absolute(expand(item.args, state.scope), state.workdir)
    state.pending_dirs.append(state.workdir)
    _replace(state, workdir=state.workdir)


def _user(item: Instruction, state: _State) -> None:
    _replace(state, user=expand(item.args, state.scope))


def _expose(item: Instruction, state: _State) -> None:
    ports = [expose_entry(expand(w, state.scope)) for w in split_words(item.args)]
    _replace(state, expose=[*state.changes.expose, *ports])


def _stopsignal(item: Instruction, state: _State) -> None:
    _replace(state, stop_signal=expand(item.args, state.scope))


def _argv(item: Instruction, state: _State) -> list[str]:
    argv = exec_form(item.args)  # CMD [] is set, and empty
    return argv if argv is not None else [*state.shell, item.args]


def _entrypoint(item: Instruction, state: _State) -> None:
    _replace(state, entrypoint=_argv(item, state))


def _cmd(item: Instruction, state: _State) -> None:
    _replace(state, cmd=_argv(item, state))


def _shell(item: Instruction, state: _State) -> None:
    shell = exec_form(item.args)
    if not shell:
        raise ValueError('SHELL wants a JSON array, e.g. ["/bin/bash", "-c"]')
    state.shell = shell


_SETTERS: dict[str, Callable[[Instruction, _State], None]] = {
    "ENV": _env, "LABEL": _label, "MAINTAINER": _maintainer, "WORKDIR": _workdir,
    "USER": _user, "EXPOSE": _expose, "STOPSIGNAL": _stopsignal, "ENTRYPOINT": _entrypoint,
    "CMD": _cmd, "SHELL": _shell,
}
