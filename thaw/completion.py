"""Shell completion for `thaw`, made from its own argument parser: `thaw completion
bash|zsh|fish` prints a script (`source <(thaw completion bash)`; zsh loads the bash
one through bashcompinit; fish gets its own `complete` lines)."""

from __future__ import annotations

import argparse


def command_tree(parser: argparse.ArgumentParser) -> dict[str, tuple[list[str], list[str]]]:
    """{"apps create": (sub-commands, flags), ...}; "" is the top level."""
    tree: dict[str, tuple[list[str], list[str]]] = {}

    def walk(path: str, p: argparse.ArgumentParser) -> None:
        subs: list[str] = []
        flags: list[str] = []
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, child in action.choices.items():
                    subs.append(name)
                    walk(f"{path} {name}".strip(), child)
            else:
                flags.extend(o for o in action.option_strings if o.startswith("--"))
        tree[path] = (subs, flags)

    walk("", parser)
    return tree


def bash(parser: argparse.ArgumentParser) -> str:
    tree = command_tree(parser)
    cases = []
    for path in sorted(tree, key=lambda p: (-p.count(" "), -len(p))):
        subs, flags = tree[path]
        words = " ".join(subs + flags)
        pattern = '""' if not path else f'"{path}"|"{path} "*'
        cases.append(f'    {pattern}) opts="{words}" ;;')
    return "\n".join([
        "# thaw completion (bash): source <(thaw completion bash)",
        "_thaw() {",
        '  local cur="${COMP_WORDS[COMP_CWORD]}" path="" w opts=""',
        '  for w in "${COMP_WORDS[@]:1:COMP_CWORD-1}"; do',
        '    case "$w" in -*) ;; *) path="$path $w" ;; esac',
        "  done",
        '  path="${path# }"',
        '  case "$path" in',
        *cases,
        "  esac",
        '  COMPREPLY=( $(compgen -W "$opts" -- "$cur") )',
        "}",
        "complete -F _thaw thaw",
        "",
    ])


def zsh(parser: argparse.ArgumentParser) -> str:
    return ("# thaw completion (zsh): source <(thaw completion zsh)\n"
            "autoload -U +X bashcompinit && bashcompinit\n" + bash(parser))


def fish(parser: argparse.ArgumentParser) -> str:
    tree = command_tree(parser)
    lines = ["# thaw completion (fish): thaw completion fish | source"]
    top_subs, top_flags = tree[""]
    lines.append(f"complete -c thaw -f -n '__fish_use_subcommand' -a '{' '.join(top_subs)}'")
    lines.extend(f"complete -c thaw -n '__fish_use_subcommand' -l {f[2:]}" for f in top_flags)
    for path, (subs, flags) in sorted(tree.items()):
        if not path:
            continue
        words = path.split()
        seen = " && ".join(f"__fish_seen_subcommand_from {w}" for w in words)
        if subs:
            lines.append(f"complete -c thaw -f -n '{seen}' -a '{' '.join(subs)}'")
        lines.extend(f"complete -c thaw -n '{seen}' -l {f[2:]}" for f in flags)
    return "\n".join(lines) + "\n"


SHELLS = {"bash": bash, "zsh": zsh, "fish": fish}
