"""The planner's batch-1 decoders: a Llama forward pass, Medusa tree verification, and the
engine adapters (torch on CPU/GPU, NxDI on Trainium) behind the serving engine interface."""
