"""Dockerfile text to instructions, and Docker's word rules. Pure: strings in, values out.

`parse_dockerfile` joins continuation lines (a trailing `\\`), drops comments and
parser directives (`# syntax=` is ignored; `# escape=` may only keep `\\`), and
returns each instruction with the line it starts on. `split_words` splits
arguments the way Docker does for ENV, LABEL and ARG (quotes and backslashes
keep spaces in a word); `expand` substitutes `$VAR`, `${VAR}`, `${VAR:-default}`,
`${VAR:+alternative}` (and the forms without the colon) and removes quotes.
`exec_form` reads a JSON array of strings (`CMD ["a", "b"]`), else None.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass

_DIRECTIVE = re.compile(r"^#\s*([a-zA-Z][a-zA-Z0-9]*)\s*=\s*(.+?)\s*$")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class DockerfileError(ValueError):
    """Refused or malformed: `line` is where the instruction starts (0: the whole file)."""

    def __init__(self, line: int, message: str) -> None:
        super().__init__(message)
        self.line = line
        self.message = message


@dataclass(frozen=True)
class Instruction:
    line: int  # 1-based, where it starts
    keyword: str  # upper case: "COPY"
    args: str  # the rest, continuation lines joined, stripped


def parse_dockerfile(text: str) -> list[Instruction]:
    lines = text.splitlines()
    start = _skip_directives(lines)
    instructions: list[Instruction] = []
    pending: list[str] = []
    first = 0
    for number, raw in enumerate(lines[start:], start + 1):
        stripped = raw.strip()
        if stripped.startswith("#") or (not stripped and pending):
            continue  # comments, and blank lines inside a continued instruction
        if not stripped:
            continue
        if not pending:
            first = number
        body = raw.rstrip()
        if body.endswith("\\"):
            pending.append(body[:-1])
            continue
        pending.append(body)
        instructions.append(_instruction(first, " ".join(p.strip() for p in pending)))
        pending = []
    if pending:
        instructions.append(_instruction(first, " ".join(p.strip() for p in pending)))
    return instructions


def _skip_directives(lines: list[str]) -> int:
    """Parser directives sit at the very top; the first other line ends them."""
    for index, raw in enumerate(lines):
        found = _DIRECTIVE.match(raw.strip())
        if not found:
            return index
        name, value = found.group(1).lower(), found.group(2)
        if name == "escape" and value != "\\":
            raise DockerfileError(index + 1, f"escape={value} is not supported (only \\)")
    return len(lines)


def _instruction(line: int, text: str) -> Instruction:
    keyword, _, args = text.strip().partition(" ")
    if not _NAME.fullmatch(keyword):
        raise DockerfileError(line, f"{keyword!r} is not an instruction")
    return Instruction(line, keyword.upper(), args.strip())


def exec_form(args: str) -> list[str] | None:
    """`["a", "b"]` -> ["a", "b"]; None when `args` is not a JSON array of strings."""
    if not args.startswith("["):
        return None
    try:
        value = json.loads(args)
    except ValueError:
        return None
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return value
    return None


def split_words(text: str) -> list[str]:
    """Whitespace-separated words; quotes and backslash escapes stay in the word (for
    `expand` to remove) and keep their spaces in it."""
    words: list[str] = []
    current: list[str] = []
    quote = ""
    i = 0
    while i < len(text):
        char = text[i]
        if char == "\\" and quote != "'" and i + 1 < len(text):
            current.append(text[i : i + 2])
            i += 2
            continue
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char.isspace():
            if current:
                words.append("".join(current))
                current = []
            i += 1
            continue
        current.append(char)
        i += 1
    if quote:
        raise ValueError(f"unmatched {quote} in {text!r}")
    if current:
        words.append("".join(current))
    return words


def expand(word: str, env: Mapping[str, str]) -> str:
    """Docker's substitution in one word: variables from `env`, quotes removed."""
    out: list[str] = []
    quote = ""
    i = 0
    while i < len(word):
        char = word[i]
        if char == "\\" and quote != "'" and i + 1 < len(word):
            following = word[i + 1]
            if quote == '"' and following not in '"$\\':
                out.append(char)
            else:
                out.append(following)
                i += 2
                continue
        elif char in "'\"" and (not quote or quote == char):
            quote = "" if quote else char
        elif char == "$" and quote != "'":
            value, i = _variable(word, i, env)
            out.append(value)
            continue
        else:
            out.append(char)
        i += 1
    return "".join(out)


def _variable(word: str, at: int, env: Mapping[str, str]) -> tuple[str, int]:
    """The value of the variable at `word[at] == "$"`, and the index after it."""
    if word.startswith("${", at):
        end = _closing_brace(word, at + 2)
        return _braced(word[at + 2 : end], env), end + 1
    found = _NAME.match(word, at + 1)
    if found is None:
        return "$", at + 1
    return env.get(found.group(0), ""), found.end()


def _closing_brace(word: str, start: int) -> int:
    depth = 1
    for index in range(start, len(word)):
        if word[index] == "{":
            depth += 1
        elif word[index] == "}":
            depth -= 1
            if depth == 0:
                return index
    raise ValueError(f"missing }} in {word!r}")


def _braced(body: str, env: Mapping[str, str]) -> str:
    found = _NAME.match(body)
    if found is None:
        raise ValueError(f"bad substitution ${{{body}}}")
    name, rest = found.group(0), body[found.end() :]
    value = env.get(name)
    if not rest:
        return value or ""
    colon = rest.startswith(":")
    operator, operand = rest[1 if colon else 0], rest[2 if colon else 1 :]
    present = value is not None and (bool(value) or not colon)
    if operator == "-":
        return value if present and value is not None else expand(operand, env)
    if operator == "+":
        return expand(operand, env) if present else ""
    if operator == "?":
        if present and value is not None:
            return value
        raise ValueError(f"{name}: {expand(operand, env) or 'not set'}")
    raise ValueError(f"unsupported substitution ${{{body}}}")


def pairs(words: list[str], env: Mapping[str, str], what: str) -> list[tuple[str, str]]:
    """`K=V` words (ENV, LABEL, ARG), each side expanded; ValueError if one has no `=`."""
    found: list[tuple[str, str]] = []
    for word in words:
        key, sep, value = word.partition("=")
        if not sep or not key:
            raise ValueError(f"{what} wants NAME=VALUE, got {word!r}")
        found.append((expand(key, env), expand(value, env)))
    return found
