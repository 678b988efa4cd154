"""Streaming calls to Triton models over gRPC, cancelled when the caller stops.

One long-lived ``tritonclient.grpc.aio`` client (one HTTP/2 connection) per assistant; every
call is its own bidirectional stream, so a load balancer routes per call. The pipeline is a
gRPC client rather than BLS on purpose: Triton 2.51's Python backend cannot cancel a BLS
request it started, while cancelling a gRPC stream (``call.cancel()``, sent as RST_STREAM)
makes Triton mark the request cancelled, which rufus_llm / rufus_qp_medusa poll every
0.25 s and abort in the engine, freeing the slot.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import numpy as np

from rufus.client import RequestFailed, _status


def tensors_to_inputs(tensors: dict[str, Any]) -> list[Any]:
    """str -> BYTES [1], bool -> BOOL [1]; dict/list -> JSON BYTES [1]."""
    import tritonclient.grpc as grpcclient

    inputs = []
    for name, value in tensors.items():
        if isinstance(value, bool):
            arr, dtype = np.array([value], dtype=bool), "BOOL"
        else:
            text = value if isinstance(value, str) else json.dumps(value)
            arr, dtype = np.array([text.encode("utf-8")], dtype=np.object_), "BYTES"
        inp = grpcclient.InferInput(name, list(arr.shape), dtype)
        inp.set_data_from_numpy(arr)
        inputs.append(inp)
    return inputs


def output_str(outputs: dict[str, np.ndarray], name: str) -> str:
    arr = outputs.get(name)
    if arr is None or arr.size == 0:
        return ""
    v = arr.reshape(-1)[0]
    return v.decode("utf-8", errors="replace") if isinstance(v, bytes) else str(v)


class TritonStreams:
    """Opens streams on one shared aio client; create inside the event loop that uses it."""

    def __init__(self, url: str) -> None:
        import tritonclient.grpc.aio as aioclient

        self.url = url
        self.client = aioclient.InferenceServerClient(url)

    async def close(self) -> None:
        await self.client.close()

    async def stream(self, model: str, tensors: dict[str, Any],
                     timeout: float = 600.0) -> AsyncIterator[dict[str, np.ndarray]]:
        """Yield each response's outputs; raise RequestFailed on an error response or a
        transport failure. Closing the generator (or cancelling the task awaiting it)
        cancels the gRPC stream."""
        import grpc

        inputs = tensors_to_inputs(tensors)

        async def requests() -> AsyncIterator[dict[str, Any]]:
            yield {"model_name": model, "inputs": inputs, "enable_empty_final_response": True}

        responses = self.client.stream_infer(requests(), stream_timeout=timeout)
        try:
            async for result, error in responses:
                if error is not None:
                    raise RequestFailed(f"{model}: {error}", _status(error))
                resp = result.get_response()
                if resp.outputs:
                    yield {o.name: result.as_numpy(o.name) for o in resp.outputs}
                final = resp.parameters.get("triton_final_response")
                if final is not None and final.bool_param:
                    return
        except grpc.RpcError as exc:
            code = exc.code() if callable(getattr(exc, "code", None)) else None
            name = code.name if code is not None else "UNKNOWN"
            details = exc.details() if callable(getattr(exc, "details", None)) else str(exc)
            raise RequestFailed(f"{model}: [{name}] {details}", name) from exc
        finally:
            responses.cancel()  # no-op once the stream ended; RST_STREAM otherwise
