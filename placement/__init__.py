"""Placement (apps API, market, wake). Not built yet: see issue 3 and README."""
