""".dockerignore patterns: which paths of the build context a build may not see. Pure.

Docker's rules, simply: one pattern a line, `#` comments, a leading `/` ignored,
`*` and `?` within one path component, `**` across any number of them, `!`
re-admits what an earlier pattern excluded, and the last pattern that matches
decides. A pattern that matches a directory matches everything under it.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass


@dataclass(frozen=True)
class IgnoreRule:
    pattern: str
    regex: re.Pattern[str]
    admits: bool  # a `!` rule


def parse_dockerignore(text: str) -> list[IgnoreRule]:
    rules: list[IgnoreRule] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        admits = line.startswith("!")
        pattern = line[1:].strip() if admits else line
        pattern = posixpath.normpath(pattern.lstrip("/")) if pattern.strip("/") else ""
        if pattern and pattern != ".":
            rules.append(IgnoreRule(pattern, _compile(pattern), admits))
    return rules


def _compile(pattern: str) -> re.Pattern[str]:
    out: list[str] = []
    i = 0
    while i < len(pattern):
        char = pattern[i]
        if pattern.startswith("**", i):
            i += 2
            if pattern.startswith("/", i):  # "**/x" also matches "x" at the top
                i += 1
                out.append("(?:.*/)?")
            else:
                out.append(".*")
            continue
        if char == "*":
            out.append("[^/]*")
        elif char == "?":
            out.append("[^/]")
        elif char == "[":
            end = pattern.find("]", i + 1)
            if end == -1:
                out.append(re.escape(char))
            else:
                body = pattern[i + 1 : end].replace("\\", "\\\\")
                out.append(f"[{'^' if body.startswith('^') else ''}{body.lstrip('^')}]")
                i = end
        elif char == "\\" and i + 1 < len(pattern):
            i += 1
            out.append(re.escape(pattern[i]))
        else:
            out.append(re.escape(char))
        i += 1
    return re.compile("".join(out))


def is_ignored(path: str, rules: list[IgnoreRule]) -> bool:
    """Whether context-relative `path` ("src/app.py") is excluded by `rules`."""
    ignored = False
    parts = path.split("/")
    prefixes = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    for rule in rules:
        if any(rule.regex.fullmatch(prefix) for prefix in prefixes):
            ignored = not rule.admits
    return ignored
