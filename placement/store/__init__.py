"""Placement's durable store: one port (port.py), one SQL implementation, two backends
(SQLite embedded, PostgreSQL shared), versioned migrations applied at start."""

from placement.store.factory import STORE_HELP, SqlStore, check_store_url, open_store
from placement.store.port import (
    EVENTS_KEPT,
    AppStore,
    HostTaken,
    ImageStore,
    SecretWrites,
    Store,
    StoredSecret,
    StoreUnavailable,
    TokenStore,
)

__all__ = ["EVENTS_KEPT", "STORE_HELP", "AppStore", "HostTaken", "ImageStore", "SecretWrites",
           "SqlStore", "Store", "StoreUnavailable", "StoredSecret", "TokenStore",
           "check_store_url", "open_store"]
