"""The edge proxy. Not built yet: see issue 3 and README ("What does not work yet")."""
