"""Placement: the Apps and Machines API, the market that places machines, and wake."""
