"""Pure decisions of the edge: no asyncio, sockets, clocks or randomness."""

from ground.native import use_native

use_native(__name__, __path__)  # compiled hot modules first, when built from these sources
