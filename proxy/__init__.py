"""Proxy layer, what runs in production: the per-unit agent (health + load) and the HAProxy
configuration for the data path. The local fleet, its benchmark and the routing simulation
are harness code in rufus/harness/. See proxy/README.md."""
