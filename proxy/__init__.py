"""Proxy layer: the per-unit agent (health + load), the HAProxy configuration for the data
path, and the fleet-scale routing simulation's shared pieces. See proxy/README.md."""
