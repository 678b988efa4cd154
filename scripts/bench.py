"""Benchmark: rufus_llm through Triton (gRPC streaming) vs vLLM's AsyncLLM in-process,
and optionally vs the official Triton vLLM backend in the same tritonserver.

Same engine arguments (model.json + the same overrides), same workload (16 shopping
questions rendered once with the chat template and sent as identical raw prompts; greedy;
ignore_eos so every request generates exactly --max-tokens), same measurement code
(lab/loadgen.py), one run (lab/bench.py). Each Triton model gets its
own tritonserver (a phase); within a phase it alternates with the in-process engine per
round, so a noisy shared machine disturbs both alike; the table shows medians over rounds
and the median of per-round ratios (rufus vs official = the ratio of their ratios to the
same in-process engine).

Every measurement starts after --gap idle seconds: a vLLM CPU worker busy-polls for 1 s
after its last request, and the two engines of a phase share the machine, so without the
gap whichever target ran second shared the CPU with the other's spinning worker. Also
measures tritonserver's time to ready (--cold-start: with an empty vLLM compile cache).

    python scripts/bench.py --concurrency 1 16 [--rounds 3] [--max-tokens 64]
    python scripts/bench.py --official /path/to/vllm_backend/src   # three-way

--official takes the `src/` folder of a checkout of triton-inference-server/vllm_backend
(not shipped here); its model.py runs unchanged except for what is prepended at run time:
the two stub workarounds every model here needs (sys.path from PYTHONPATH, UTF-8 locale)
and lab/official_backend_shim.py (three names that moved in vLLM 0.32).
"""

from lab.bench import main

if __name__ == "__main__":
    raise SystemExit(main(doc=__doc__))
