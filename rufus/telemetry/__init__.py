"""What the stack tells an operator: traces (tracing.py) and the metric-name contract."""
