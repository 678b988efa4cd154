"""Proxy layer, what runs in production: the per-unit agent (health + load) and the HAProxy
configuration for the data path. The local fleet is in rufus/launch/; its benchmarks and
the routing simulation are in lab/. See proxy/README.md."""
