"""Credentials of thaw: bearer tokens for the public API, HMAC signatures for internal calls.

`tokens` and `signing` are pure (time, randomness and keys are arguments);
`secrets_files` reads and writes key and token files; `aiohttp_glue` signs
outgoing and checks incoming aiohttp requests.
"""
