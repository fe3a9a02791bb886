"""The edge proxy: routes Host to an app, holds requests of cold apps while
placement wakes a machine, balances warm requests over started machines, and
stops idle machines through placement. See docs/edge.md.
"""

from ground.native import use_native

use_native(__name__, __path__)  # compiled hot modules first, when built from these sources
