"""Placement's configuration refuses what it cannot run with, naming the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from placement.config import PlacementConfig
from tests.support.credentials import RING


@pytest.mark.parametrize(("field", "value"), [
    ("failed_mark_s", 0.0), ("failed_mark_s", -1.0), ("offer_timeout_s", 0.0),
    ("heartbeats_fresh", 0), ("store_pool_size", 0), ("port", 65536),
])
def test_a_value_out_of_range_is_refused_naming_its_field(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=field):
        PlacementConfig(state_dir=Path("/nonexistent"), cluster_keys=RING, **{field: value})


def test_the_failure_mark_is_thirty_seconds_unless_told() -> None:
    assert PlacementConfig(state_dir=Path("/x"), cluster_keys=RING).failed_mark_s == 30.0
    assert PlacementConfig(state_dir=Path("/x"), cluster_keys=RING,
                           failed_mark_s=5).failed_mark_s == 5
