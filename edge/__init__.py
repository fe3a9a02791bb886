"""The edge proxy: routes Host to an app, holds requests of cold apps while
placement wakes a machine, balances warm requests over started machines, and
stops idle machines through placement. See docs/edge.md.
"""
