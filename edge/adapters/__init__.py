"""IO of the edge's control side: placement client, admin HTTP server."""
