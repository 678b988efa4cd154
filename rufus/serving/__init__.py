"""Code that runs inside the Triton Python-backend stub: config, validation, the engine host,
the per-request hot path, responses, metrics and the ``pb_utils`` adapter. Nothing here
starts processes of its own except the engine it hosts."""
