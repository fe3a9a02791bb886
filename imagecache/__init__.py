"""Content-addressed image layer cache: OCI pulls, verified blobs, safe unpack, byte-LRU."""
