"""Which machine records the edge routes by: those sealed by their worker's route ticket.

Any agent may write any app's machine records (Redis ACLs check key names, not hash
fields), so with route keys the edge takes only records sealed with the ticket
placement gave the machine's worker (ground/auth/tickets.py). A record that does not
verify is ignored: the view keeps what it knew of that machine. Each distinct
record is judged once (by content: a resync re-reading the same records costs a
lookup), logged once, and counted under its reason. Never on the request path.
"""

from __future__ import annotations

import logging
from collections import Counter

from ground.auth.tickets import RecordCheck, RouteKeys
from ground.registry import MachineRecord

log = logging.getLogger("thaw.edge.view")


class RouteGuard:
    def __init__(self, keys: RouteKeys | None) -> None:
        self.check = RecordCheck(keys)
        self.refused: Counter[str] = Counter()  # reason -> distinct records refused

    @property
    def verifies(self) -> bool:
        return self.check.keys is not None

    def __call__(self, app: str, record: MachineRecord) -> bool:
        """May the edge route by `record` (of `app`'s hash)?"""
        verdict = self.check.judge(record)
        if verdict.reason is None:
            return True
        if verdict.new:
            self.refused[verdict.reason] += 1
            log.warning("machine record refused (%s): machine %s of app %s on worker %s, "
                        "state %s: not sealed by a ticket placement gave that worker",
                        verdict.reason, record.id, app, record.worker or "?", record.state)
        return False
