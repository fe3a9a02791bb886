"""The ground every service stands on: an app's config, the registry port and its Redis
adapter, authentication and signing, host names, image references, periodic work, state
files, logging, TLS contexts and the native build's switch. It imports no service (edge,
placement, agent, imagecache) and nothing of `thaw`, the composition root
(tests/unit/test_ground_imports.py)."""
