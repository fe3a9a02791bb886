""".dockerignore: which paths of the build context a build may not see."""

from __future__ import annotations

import pytest

from thaw.dockerignore import is_ignored, parse_dockerignore

RULES = parse_dockerignore("""
# comments and blank lines are skipped

/.git
*.pyc
**/__pycache__
docs
!docs/keep.md
build/*.o
data?.csv
""")


@pytest.mark.parametrize("path, ignored", [
    (".git", True), (".git/config", True),
    ("app.pyc", True), ("pkg/app.pyc", False),  # "*" stays in one component
    ("__pycache__/x.cpython-311.pyc", True), ("a/b/__pycache__/y", True),
    ("docs", True), ("docs/other.md", True), ("docs/keep.md", False),
    ("build/main.o", True), ("build/sub/main.o", False),
    ("data1.csv", True), ("data10.csv", False),
    ("app.py", False), ("src/app.py", False),
])
def test_patterns_follow_dockers_rules(path: str, ignored: bool) -> None:
    assert is_ignored(path, RULES) is ignored


def test_the_last_matching_pattern_decides() -> None:
    rules = parse_dockerignore("!keep.txt\n*.txt\n")
    assert is_ignored("keep.txt", rules)


def test_no_rules_ignore_nothing() -> None:
    assert not is_ignored("anything", parse_dockerignore(""))
