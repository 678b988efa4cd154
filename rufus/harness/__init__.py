"""Operator and test harness: the one tritonserver launcher, the local unit rig with its
supervisor, and the load generator used by the benchmarks. Never imported by the stub."""
