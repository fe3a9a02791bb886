"""Which suspended machine the edge thaws itself: the one placement's wake would resume."""

from __future__ import annotations

import msgspec

from edge.core.thawpick import to_thaw
from ground.appconfig import parse
from ground.registry.types import MachineRecord

DIGEST = "sha256:" + "a" * 64
CONFIG = msgspec.structs.replace(
    parse({"name": "web", "image": "img", "regions": ["fra", "ams"]}),
    uid="0123456789abcdef", release=3, image_digest=DIGEST)


def suspended(mid: str, **fields: object) -> MachineRecord:
    record = MachineRecord(id=mid, app="web", worker="w1", region="fra", state="suspended",
                           image_digest=DIGEST, created_at=1.0, updated_at=2.0,
                           app_uid=CONFIG.uid, release=3)
    return msgspec.structs.replace(record, **fields)


def chosen(records: list[MachineRecord], region: str = "") -> str | None:
    found = to_thaw(records, CONFIG, region)
    return found.id if found is not None else None


def test_the_lowest_id_of_the_current_release_in_the_region_woken() -> None:
    records = [suspended("m5"), suspended("m3"), suspended("m1", region="ams"),
               suspended("m2", release=2), suspended("m0", app_uid="fedcba9876543210")]
    assert chosen(records) == "m3"  # primary fra; m2 is an older release, m0 another app's
    assert chosen(records, "ams") == "m1"
    assert chosen(records, "lhr") is None
    assert chosen([]) is None


def test_a_machine_made_before_releases_counts_as_current_while_it_runs_the_apps_image(
) -> None:
    assert chosen([suspended("m1", release=0)]) == "m1"  # as placement's machine_release
    assert chosen([suspended("m1", release=0, image_digest="sha256:" + "b" * 64)]) is None


def test_nothing_while_one_is_starting_and_only_plain_ids() -> None:
    assert chosen([suspended("m1"), suspended("m2", state="starting")]) is None
    assert chosen([suspended("m1", state="stopped")]) is None  # a boot: placement's
    assert chosen([suspended("../x"), suspended("a b"), suspended("m" * 65)]) is None
    assert chosen([suspended("../x"), suspended("m9")]) == "m9"
