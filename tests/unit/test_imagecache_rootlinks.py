"""Resolving a rootfs symlink inside the root, component by component: pure, a dict for a disk."""

from __future__ import annotations

import pytest

from imagecache.core.rootlinks import MAX_LINKS, Node, NodeKind, check_link

DIR = Node(NodeKind.DIRECTORY)
FILE = Node(NodeKind.OTHER)


def _link(target: str) -> Node:
    return Node(NodeKind.SYMLINK, target)


def _check(tree: dict[str, Node], path: str, max_steps: int = 10_000) -> str | None:
    """Check the link at `path` in `tree` (rootfs-relative path -> node; absent = missing)."""
    node = tree[path]
    assert node.kind is NodeKind.SYMLINK
    return check_link(
        path, node.target, lambda rel: tree.get(rel, Node(NodeKind.MISSING)), max_steps=max_steps
    ).refusal


def test_climbing_through_a_link_to_the_root_is_refused_though_lexically_inside() -> None:
    tree = {"b": _link("."), "a": _link("b/b/b/../..")}
    assert _check(tree, "a") == "climbs above the root"


def test_a_link_to_a_deep_directory_lets_a_target_climb_that_lexically_could_not() -> None:
    tree = {"usr": DIR, "usr/lib": DIR, "usr/lib/deep": DIR, "s": _link("usr/lib/deep"),
            "up": _link("s/../..")}
    assert _check(tree, "up") is None


@pytest.mark.parametrize(
    ("tree", "path", "refusal"),
    [
        ({"a": DIR, "a/link": _link("../b")}, "a/link", None),
        ({"a": DIR, "a/link": _link("../../b")}, "a/link", "climbs above the root"),
        ({"link": _link("..")}, "link", "climbs above the root"),
        ({"a": DIR, "a/b": DIR, "a/b/l": _link("/usr/bin/python3")}, "a/b/l", None),
        ({"l": _link("/../etc")}, "l", "climbs above the root"),
        ({"X11": _link(".")}, "X11", None),
        ({"l": _link("missing/../..")}, "l", "climbs above the root"),  # lexical past a gap
        ({"f": FILE, "l": _link("f/../x")}, "l", None),
    ],
)
def test_targets_resolve_from_the_links_directory_or_the_root(
    tree: dict[str, Node], path: str, refusal: str | None
) -> None:
    assert _check(tree, path) == refusal


def test_an_absolute_link_resolves_from_the_rootfs_root_even_through_other_links() -> None:
    tree = {"d": DIR, "d/e": DIR, "abs": _link("/d/e"), "l": _link("abs/../../..")}
    assert _check(tree, "l") == "climbs above the root"


def test_links_past_the_kernel_limit_are_refused_rather_than_left_to_loop() -> None:
    tree = {"x": _link("x")}
    assert _check(tree, "x") == f"follows more than {MAX_LINKS} links"


def test_work_is_bounded_by_the_step_budget() -> None:
    tree = {"l": _link("/".join(["a", ".."] * 100))}
    assert _check(tree, "l", max_steps=50) == "takes more than 50 steps to resolve"
    assert _check(tree, "l") is None
