"""Benchmark: one node vs the two-node unit (leader + follower, pipeline parallel 2).

One run, same workload (lab/loadgen.py through Triton gRPC streaming: chat prompts,
greedy, ignore_eos, --max-tokens per request), same engine arguments except the split:

1. single-node tritonserver (model.json + --engine-args);
2. the two-node unit from rufus/launch/rig.py under its Supervisor (+ pipeline_parallel_size=2);
3. failure drill on the unit (lab/bench.py): SIGKILL the follower's process group
   during a stream and time
   (a) the in-flight stream's UNAVAILABLE, (b) the leader's model going not ready,
   (c) the supervisor's whole-unit restart until it serves a correct answer again.

    python scripts/bench_multinode.py [--concurrency 1 16] [--max-tokens 64] [--json out.json]
"""

from lab.multinode_bench import main

if __name__ == "__main__":
    raise SystemExit(main(doc=__doc__))
