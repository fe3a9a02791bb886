"""Pure decisions of the edge: no asyncio, sockets, clocks or randomness."""
