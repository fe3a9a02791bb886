"""Every Redis key name thaw uses, built here and nowhere else."""

from __future__ import annotations

PREFIX = "thaw"


def worker(worker_id: str) -> str:
    return f"{PREFIX}:worker:{worker_id}"


def workers() -> str:
    return f"{PREFIX}:workers"


def worker_layers(worker_id: str) -> str:
    return f"{PREFIX}:worker-layers:{worker_id}"


def layer_holders(digest: str) -> str:
    return f"{PREFIX}:layer:{digest}"


def machines(app: str) -> str:
    return f"{PREFIX}:machines:{app}"


def apps() -> str:
    return f"{PREFIX}:apps"


def changes() -> str:
    """The routes feed: app, machine and republished changes (every edge follows it)."""
    return f"{PREFIX}:changes"


def worker_changes() -> str:
    """The workers' feed: worker (heartbeat) and layers changes (placement follows it)."""
    return f"{PREFIX}:worker-changes"


def worker_epoch(worker_id: str) -> str:
    """The highest epoch seen of a worker; outlives the heartbeat TTL so fencing survives
    it. A key per worker (not a shared hash) so that a worker's ACL user may write its own
    and no other's (docs/security.md)."""
    return f"{PREFIX}:worker-epoch:{worker_id}"


def generation() -> str:
    """A random name set once per incarnation of the registry: gone with the data."""
    return f"{PREFIX}:generation"


def republished() -> str:
    """The generation under which a placement last published every stored app again: the
    edges keep their view after a loss until it names the current generation."""
    return f"{PREFIX}:republished"


def lease(name: str) -> str:
    """`holder|token` of a lease (placement/leases.py), expiring with it."""
    return f"{PREFIX}:lease:{name}"


def lease_released() -> str:
    """The channel a lease's name is published on when its holder releases it."""
    return f"{PREFIX}:lease-released"


def lease_tokens() -> str:
    """The last fencing token issued (tokens never go below it)."""
    return f"{PREFIX}:lease-tokens"


def wake_claims(app: str) -> str:
    """What each placement's wakes of `app` are starting: placement id -> JSON."""
    return f"{PREFIX}:wake-claims:{app}"


def machine_load() -> str:
    """Each edge's requests in flight per machine: edge id -> "expiry_ms JSON"."""
    return f"{PREFIX}:machine-load"


def machine_load_news() -> str:
    """A stream an edge adds to when it begins to load a machine it did not load in its
    last share (resting edges wait on it: edge/loadshare.py)."""
    return f"{PREFIX}:machine-load-news"


def worker_failures() -> str:
    """Workers placements marked failed: worker id -> "expiry_ms epoch reason"."""
    return f"{PREFIX}:worker-failures"


def worker_reports(worker: str, epoch: int) -> str:
    """Edges' reports of a worker running under `epoch` (its agent's incarnation), heard
    by any placement: JSON [reporter, machine] -> "expiry_ms "."""
    return f"{PREFIX}:worker-reports:{worker}:{epoch}"


def placements() -> str:
    """Each placement's advert (its API URL, sealed): placement id -> "expiry_ms JSON"."""
    return f"{PREFIX}:placements"


def wake_demand(app: str) -> str:
    """Requests each edge holds or forwards for `app`: edge id -> "expiry_ms demand"."""
    return f"{PREFIX}:wake-demand:{app}"
