"""Offline planner tooling (never imported at serving time): artifact build, training data,
distillation, tree search, losslessness and evaluation."""
