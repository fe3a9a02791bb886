"""Contexts: the platforms the CLI talks to, by name, as kubectl's and flyctl's configs
keep them — an API URL, the file its token is in, the CA its certificate is checked
against. `thaw up` writes the context `local` (its own ports, its state dir's token and
CA) and makes it current, so `thaw status` works from any directory with no flags; `thaw
context add|use|list|remove` manage others; `--context NAME` (or $THAW_CONTEXT, or a
`context = "NAME"` line in the thaw.toml a command reads) picks one for a command. A
context also says where the platform serves an app (`app_url`), for `thaw apps open` and
`thaw status APP`.

They live in `$THAW_CONFIG/contexts.json`, else `$XDG_CONFIG_HOME/thaw/`, else
`~/.config/thaw/` (mode 0600 in a 0700 directory: it names token files, not tokens).
Each change is written whole under a lock (two `thaw up` on one host do not lose each
other's).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import msgspec

from ground.statefiles import file_lock, write_private

FILE = "contexts.json"
LOCAL = "local"  # the context `thaw up` writes
NAME_MAX = 64


class ContextError(ValueError):
    pass


class Context(msgspec.Struct, frozen=True):  # fields a newer thaw adds are ignored
    api: str
    token_file: str = ""  # read at each command (a rotated token is picked up)
    cacert: str = ""
    # where the platform serves an app, `{app}` standing for its name, e.g.
    # "https://{app}.example.com/" ("": not known; `thaw apps open` says how to set it)
    app_url: str = ""
    # where `thaw deploy` puts an image it built (thaw.toml's [build]): "oci:/DIR", a layout
    # the platform reads, or "http(s)://HOST:PORT", a registry ("": none; thaw/appbuild.py)
    images: str = ""


APP = "{app}"


def app_url(template: str, app: str) -> str:
    """An app's URL from a context's `app_url` template."""
    return template.replace(APP, app)


def check_app_url(template: str) -> str:
    """A context's `app_url`: http(s), naming `{app}` once, or "" (not known)."""
    if template and (template.count(APP) != 1
                     or not template.startswith(("http://", "https://"))):
        raise ContextError(f"--app-url: an http(s) URL with {APP} where the app's name goes, "
                           f"e.g. https://{APP}.example.com/, not {template[:200]!r}")
    return template


class Contexts(msgspec.Struct, frozen=True):
    current: str = ""
    contexts: dict[str, Context] = msgspec.field(default_factory=dict)


def config_dir() -> Path:
    if given := os.environ.get("THAW_CONFIG"):
        return Path(given)
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "thaw"


def load() -> Contexts:
    path = config_dir() / FILE
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return Contexts()
    except OSError as exc:
        raise ContextError(f"{path}: {exc.strerror}") from None
    try:
        return msgspec.json.decode(data, type=Contexts)
    except msgspec.MsgspecError as exc:
        raise ContextError(f"{path}: not a contexts file ({exc}); remove it or fix it") \
            from None


def change(edit: Callable[[Contexts], Contexts]) -> Contexts:
    """Read, edit and write the contexts whole, under a lock."""
    directory = config_dir()
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    with file_lock(directory / (FILE + ".lock")):
        changed = edit(load())
        write_private(directory / FILE,
                      msgspec.json.format(msgspec.json.encode(changed), indent=2) + b"\n")
    return changed


def check_name(name: str) -> str:
    if not name or len(name) > NAME_MAX or not all(c.isalnum() or c in "-_." for c in name):
        raise ContextError(f"a context name is 1-{NAME_MAX} letters, digits, '-', '_' or "
                           f"'.', not {name[:NAME_MAX]!r}")
    return name


def put(name: str, context: Context, *, use: bool = False) -> Contexts:
    """Add or replace context `name`; current too if `use` or there is none."""
    check_name(name)

    def edit(now: Contexts) -> Contexts:
        current = name if use or not now.current else now.current
        return Contexts(current=current, contexts={**now.contexts, name: context})

    return change(edit)


def use(name: str) -> Contexts:
    def edit(now: Contexts) -> Contexts:
        if name not in now.contexts:
            raise ContextError(unknown(name, now))
        return msgspec.structs.replace(now, current=name)

    return change(edit)


def remove(name: str) -> Contexts:
    def edit(now: Contexts) -> Contexts:
        if name not in now.contexts:
            raise ContextError(unknown(name, now))
        left = {k: v for k, v in now.contexts.items() if k != name}
        return Contexts(current="" if now.current == name else now.current, contexts=left)

    return change(edit)


def chosen(name: str) -> Context | None:
    """Context `name` ("" : the current one, None if there is none); an unknown name is
    an error naming the known ones."""
    contexts = load()
    wanted = name or contexts.current
    if not wanted:
        return None
    found = contexts.contexts.get(wanted)
    if found is None:
        raise ContextError(unknown(wanted, contexts))
    return found


def unknown(name: str, contexts: Contexts) -> str:
    known = ", ".join(sorted(contexts.contexts)) or "none"
    return f"no context {name!r} (known: {known}; `thaw context list`)"
