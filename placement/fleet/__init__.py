"""The fleet as placement sees it: workers and machines from the registry and the agents
(fleet.py), the fleet index kept from the feed (fleetindex.py), failure marks shared
between placements (failuresync.py), and the registry refilled after a loss
(republish.py). It imports neither the wakes nor the reconciling."""
