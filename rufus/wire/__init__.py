"""Names on the wire that clients, servers and the proxy layer agree on.

Constants only, with no imports: the CLI client (``rufus.client``), the Triton stub
(``rufus.serving``), the launcher and the unit agent and HAProxy configs (``proxy/``) each
import them from here, so none of them pulls in another's code to learn a name.
"""

from __future__ import annotations

# The conversation key: gRPC metadata (HTTP header) that keeps a conversation's requests on
# one unit behind the ingress (bounded-load consistent hashing, proxy/haproxy.py), so a
# follow-up finds its history in that unit's prefix cache. Any short opaque string
# (rufus/serving/validation.py check_conversation_key); tritonserver forwards it to the
# models as a request parameter of the same name, and the assistant passes it on to its
# answer-model requests.
CONVERSATION_HEADER = "x-rufus-conversation"

# The engine's configured size on Triton's metrics endpoint: EngineCapacity field ->
# (metric family, description). rufus/serving/metrics.py exports them; the unit agent
# (proxy/capacity.py) parses these names.
CAPACITY_GAUGES: dict[str, tuple[str, str]] = {
    "sequences": ("rufus_engine_capacity_sequences",
                  "Sequences the engine batches at most (max_num_seqs x data-parallel engines)"),
    "kv_cache_tokens": ("rufus_engine_kv_cache_tokens",
                        "Tokens the KV cache holds (num_gpu_blocks x block_size)"),
    "max_model_len": ("rufus_engine_max_model_len", "Longest sequence the engine accepts, tokens"),
    "nodes": ("rufus_engine_nodes", "Nodes the engine spans (the unit's size)"),
    "tensor_parallel": ("rufus_engine_tensor_parallel_size", "Tensor-parallel degree"),
    "pipeline_parallel": ("rufus_engine_pipeline_parallel_size", "Pipeline-parallel degree"),
}
