"""Pure placement logic: the market, the offer loop, wake and autostop plans."""
