"""Which suspended machine the edge thaws itself when an app with nothing up here is
woken (edge/adapters/thaw.py): the one placement's wake would resume first.

Placement's order (placement/core/wake.py `REUSABLE_ORDER`): a machine already
`starting` before anything else — the wake waits for it, so the edge thaws nothing —
then `suspended` ones, the lowest id first, of the app's current release (a machine
made before releases counts as current while it runs the app's image:
`ground.appconfig.release_of`), in the region the wake is for. Placement also leaves out
machines other wakes have claimed and machines on workers it holds failed; the edge
sees neither, so two edges, or an edge and a wake, may pick different machines only
when those differ — the agent's start is idempotent, and an extra machine woken so is
the autoscaler's to stop again.

Pure: records in, a record out.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from ground.appconfig import AppConfig, release_of
from ground.registry.types import MachineRecord

SUSPENDED = "suspended"
STARTING = "starting"
RESTING = frozenset({SUSPENDED, STARTING})  # the states the edge keeps for this
# what a machine id must be for the edge to name it in a call's path (placement's and
# the agents' ids are hex; anything else is not asked about)
PLAIN_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")


def to_thaw(records: Iterable[MachineRecord], config: AppConfig,
            region: str) -> MachineRecord | None:
    """The suspended machine of `config`'s app (this incarnation) a wake for `region`
    ("": the app's primary) would resume first; None if one is starting, or none fits
    (an id that is not plain is never chosen: it goes into a call's path)."""
    region = region or config.regions[0]
    chosen: MachineRecord | None = None
    for record in records:
        if record.app_uid != config.uid:
            continue
        if record.state == STARTING:
            return None
        if (record.state == SUSPENDED and record.region == region
                and PLAIN_ID.fullmatch(record.id) is not None
                and release_of(record.release, record.image_digest, config) == config.release
                and (chosen is None or record.id < chosen.id)):
            chosen = record
    return chosen
