#!/usr/bin/env bash
# Rolling update of the docker compose rig, cell (unit) by cell, keeping capacity.
# NOT RUN HERE: the machines this was written on have no Docker engine; it was only checked
# with `bash -n` and shellcheck-style review. See deploy/README.md.
#
#   RUFUS_IMAGE=rufus-inference:cpu-new scripts/rolling_update.sh [cell ...]   (default: a b)
#
# For each cell, one at a time:
#   1. drain: stop the cell's unit agent. The ingress health-checks each unit through its
#      agent, so HAProxy takes the cell out of rotation; connections already open finish.
#   2. wait until the leader has no request in flight (Triton's
#      nv_inference_pending_request_count and the gRPC connections HAProxy holds), at most
#      DRAIN_TIMEOUT seconds.
#   3. recreate leader + follower (+ agent) with the new image, together: a unit's nodes must
#      run the same software.
#   4. wait until the agent reports the whole unit healthy, then go on to the next cell.
# Capacity: all other cells keep serving throughout. With one cell the rig has nothing to
# keep serving: start cell b first (`--profile cell-b up -d`) for a capacity-keeping update.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
COMPOSE=(docker compose -f "$ROOT/docker/compose.yaml" --profile cell-b)
DRAIN_TIMEOUT="${DRAIN_TIMEOUT:-300}"
READY_TIMEOUT="${READY_TIMEOUT:-1800}"
CELLS=("$@")
[[ ${#CELLS[@]} -gt 0 ]] || CELLS=(a b)

say() { printf '[rolling_update %s] %s\n' "$(date +%H:%M:%S)" "$*"; }

svc() {  # svc ROLE CELL -> compose service name (cell a has no suffix)
  if [[ "$2" == a ]]; then echo "$1"; else echo "$1-$2"; fi
}

running() { [[ -n "$("${COMPOSE[@]}" ps -q --status running "$1" 2>/dev/null)" ]]; }

pending() {  # requests queued or executing on a cell's leader (Triton metric)
  "${COMPOSE[@]}" exec -T "$1" python - <<'PY' 2>/dev/null || echo 0
import re, urllib.request
text = urllib.request.urlopen("http://127.0.0.1:8002/metrics", timeout=5).read().decode()
print(int(sum(float(v) for v in re.findall(r"^nv_inference_pending_request_count\{.*\} (\S+)$", text, re.M))))
PY
}

unit_healthy() {
  "${COMPOSE[@]}" exec -T "$1" python /opt/rufus/docker/healthcheck.py >/dev/null 2>&1
}

live=0
for c in a b; do running "$(svc leader "$c")" && live=$((live + 1)); done
if [[ $live -lt 2 ]]; then
  say "only $live cell running: capacity cannot be kept during the update (continuing)"
fi

for cell in "${CELLS[@]}"; do
  leader="$(svc leader "$cell")" follower="$(svc follower "$cell")" agent="$(svc agent "$cell")"
  say "cell $cell: draining (stopping $agent takes it out of the ingress)"
  "${COMPOSE[@]}" stop "$agent"
  deadline=$((SECONDS + DRAIN_TIMEOUT))
  while (( SECONDS < deadline )); do
    n="$(pending "$leader")"
    [[ "$n" == 0 ]] && break
    say "cell $cell: $n request(s) in flight"
    sleep 5
  done
  say "cell $cell: recreating $leader $follower $agent with ${RUFUS_IMAGE:-rufus-inference:cpu}"
  "${COMPOSE[@]}" up -d --no-deps --force-recreate "$leader" "$follower" "$agent"
  deadline=$((SECONDS + READY_TIMEOUT))
  until unit_healthy "$agent"; do
    if (( SECONDS >= deadline )); then
      say "cell $cell: not healthy after ${READY_TIMEOUT}s: stopping the rollout here"
      exit 1
    fi
    sleep 10
  done
  say "cell $cell: healthy and back in rotation"
done
say "done: ${CELLS[*]}"
