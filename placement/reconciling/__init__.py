"""Keeping each app's shape: when a pass runs (passes.py), what it decides
(reconciler.py, the rules in placement/core/reconcile.py) and its actions carried out
(appactions.py). It stands on the fleet and the wakes."""
