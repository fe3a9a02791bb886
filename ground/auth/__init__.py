"""Credentials of thaw: bearer tokens for the public API, HMAC signatures for internal calls.

`tickets` (routes of machines: which worker may publish which), `tokens` and `signing` are
pure (time, randomness and keys are arguments);
`secrets_files` reads and writes key and token files; `aiohttp_glue` signs
outgoing and checks incoming aiohttp requests.
"""
