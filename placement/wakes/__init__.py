"""Cold wakes: a wake planned, placed and started within its deadline (waker.py, with
its parts in wakeparts.py) and the claims every placement's wakes share
(wakeclaims.py, its rules in placement/core/claims.py). It stands on the fleet."""
