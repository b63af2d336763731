"""Serving: the HTTP API and search page over the library (`app`), its request models (`protocol`), the open
versions and the search batcher it answers from, access control, metrics, and the shards of a distributed server."""
