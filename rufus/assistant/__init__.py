"""The shopping assistant (issue 16): plan -> retrieve -> grounded, streamed answer."""

from rufus.assistant.pipeline import Assistant, AssistantEvent, AssistantMetrics, validate_request

__all__ = ["Assistant", "AssistantEvent", "AssistantMetrics", "validate_request"]
