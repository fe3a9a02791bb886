"""The edge's IO: front doors (http1), the machine side (upstream), the registry feed,
placement's client and the admin server."""

from ground.native import use_native

use_native(__name__, __path__)  # compiled hot modules first, when built from these sources
