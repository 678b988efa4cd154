"""`make rig`: a two-node inference unit on this machine, supervised as one group.

Leader = tritonserver serving rufus_llm as rank 0; follower = `python -m follower` as rank 1;
pipeline_parallel_size=2 splits the default model's layers between them. If any node dies
(or the leader's model goes not-ready), the whole unit is stopped and started again, like
LeaderWorkerSet's RecreateGroupOnPodRestart. Ctrl-C stops everything.

    python scripts/rig.py [--nnodes 2] [--mode loopback|netns] [--grpc-port 8001 ...]
"""

from rufus.launch.rig import main

if __name__ == "__main__":
    raise SystemExit(main(doc=__doc__))
