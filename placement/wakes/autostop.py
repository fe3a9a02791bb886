"""An edge saw a machine idle past its app's `auto_stop` time: stop it (or suspend it,
as the app asks) unless the rule in `core/wake.py` `decide_autostop` keeps it — the
app's `min_machines_running`, or a machine not running. Kept: 409 with the rule's code."""

from __future__ import annotations

import logging

from agent.api import MachineView
from ground.appconfig import AppConfig
from ground.logs import event
from placement.core.wake import Refuse, decide_autostop, states_of
from placement.errors import Conflict, worker_said
from placement.fleet.fleet import Fleet
from placement.ports.workers import Refused

log = logging.getLogger("thaw.placement")


async def autostop(fleet: Fleet, config: AppConfig, machine_id: str) -> MachineView:
    url = await fleet.locate(config, machine_id)
    views = await fleet.own_machines(config)
    decision = decide_autostop(config, states_of(views, config), machine_id)
    if isinstance(decision, Refuse):
        event(log, "autostop", logging.DEBUG, app=config.name, machine=machine_id,
              result="kept", reason=decision.code)
        raise Conflict(decision.message, code=decision.code)
    workers = fleet.agents
    answer = await (workers.suspend(url, machine_id) if decision.suspend
                    else workers.stop(url, machine_id))
    if not isinstance(answer, MachineView):
        status = answer.status if isinstance(answer, Refused) else 0
        event(log, "autostop", logging.WARNING, app=config.name, machine=machine_id,
              result="error", status=status)
        raise worker_said(answer)
    event(log, "autostop", app=config.name, machine=machine_id,
          result="suspended" if decision.suspend else "stopped")
    return answer
