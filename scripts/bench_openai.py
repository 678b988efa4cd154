"""OpenAI API benchmark (vLLM's serving benchmark): our frontend -> Triton -> rufus_llm vs
vLLM's own OpenAI server, same engine arguments, same run. Logic: lab/bench_openai.py.

    python scripts/bench_openai.py --concurrency 1 16 --output-len 64 [--rounds 2] [--json F]
"""

from __future__ import annotations

from lab.bench_openai import main

if __name__ == "__main__":  # vLLM starts engine processes with spawn: keep the guard
    raise SystemExit(main())
