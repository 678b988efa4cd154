"""The shopping assistant (issue 16): plan -> retrieve -> grounded, streamed answer."""

from rufus.assistant.pipeline import Assistant, AssistantEvent, AssistantMetrics, validate_request
from rufus.assistant.turn_events import DoneEvent, PlanEvent, ProductsEvent, TextEvent

__all__ = ["Assistant", "AssistantEvent", "AssistantMetrics", "DoneEvent", "PlanEvent",
           "ProductsEvent", "TextEvent", "validate_request"]
