"""The planner's int8 forward pass by row count, fused against op by op on the same weights,
with the hidden states compared: the benchmark behind scripts/bench_qp_passes.py (its
docstring and --help)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any


def median_ms(fn: Any, reps: int) -> float:
    fn()
    fn()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    ts.sort()
    return ts[len(ts) // 2] * 1e3


def main(argv: list[str] | None = None, doc: str = __doc__) -> None:
    ap = argparse.ArgumentParser(description=doc,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8, 12, 16, 24, 32, 64])
    ap.add_argument("--context", type=int, default=200)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--model", help="planner directory (default: the built one)")
    ap.add_argument("--json")
    a = ap.parse_args(argv)

    import torch

    from rufus.machine.cpu import describe
    from rufus.qp.build import qp_model_dir
    from rufus.qp.decoder.torch_llama import TorchLlama

    torch.set_num_threads(a.threads)
    model = a.model or str(qp_model_dir())
    models = {}
    for name, off in (("op_by_op", "fused"), ("fused", "")):
        os.environ["RUFUS_LAB_OFF"] = off
        models[name] = TorchLlama(model, "int8", 1024)
    if not models["fused"].fused:
        sys.exit("no fused pass on this CPU (the int8 kernel did not load): nothing to compare")
    cpu = describe()
    print(f"[bench_qp_passes] {cpu['cpu_key']}, {a.threads} threads", flush=True)
    torch.manual_seed(0)
    ctx = torch.randint(0, models["fused"].vocab_size, (a.context,))
    for m in models.values():  # the same cached context in both
        m.forward(ctx, torch.arange(a.context), 0,
                  torch.ones(a.context, a.context, dtype=torch.bool).tril())
    rows_out = []
    for n in a.rows:
        ids = torch.randint(0, models["fused"].vocab_size, (n,))
        pos = torch.arange(a.context, a.context + n)
        mask = torch.ones(n, a.context + n, dtype=torch.bool)
        hs = {k: m.forward(ids, pos, a.context, mask) for k, m in models.items()}
        diff = float((hs["fused"] - hs["op_by_op"]).abs().max() / hs["op_by_op"].abs().max())
        ms = {k: median_ms(lambda m=m, i=ids, p=pos, v=mask: m.logits(m.forward(
            i, p, a.context, v)), a.reps) for k, m in models.items()}
        rows_out.append({"rows": n, **{f"{k}_ms": round(v, 2) for k, v in ms.items()},
                         "speedup": round(ms["op_by_op"] / ms["fused"], 2),
                         "max_rel_diff": diff})
        print(f"[bench_qp_passes] {n:3d} rows: op by op {ms['op_by_op']:7.2f} ms, fused "
              f"{ms['fused']:7.2f} ms ({ms['op_by_op'] / ms['fused']:.2f}x), hidden states "
              f"differ by {diff:.1e} (relative)", flush=True)
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps({
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "cpu": cpu,
            "threads": a.threads, "context": a.context, "passes": rows_out}, indent=1))

