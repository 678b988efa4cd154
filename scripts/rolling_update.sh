#!/usr/bin/env bash
# Rolling update of the docker compose rig (docker/compose.yaml), cell by cell, keeping
# capacity: at most one cell is out of the ingress's rotation at any time, and a cell's
# leader and follower always run the same image.
#
#   scripts/rolling_update.sh [--image IMAGE] [cell ...]
#       IMAGE: the new image (default rufus-inference:cpu); cells: a, b (default both)
#
# For each cell, one at a time:
#   0. wait until every other cell is in rotation (never take out a second cell);
#   1. drain: stop the cell's unit agent. HAProxy health-checks each unit through its agent,
#      so it takes the cell out of rotation (checked on HAProxy's stats page); streams
#      already open finish where they are;
#   2. wait until HAProxy holds no stream to the cell (gRPC and HTTP backends, its own
#      exact count), at most DRAIN_TIMEOUT seconds;
#   3. recreate leader + follower + agent together on the new image;
#   4. wait until the cell's agent reports every model of the unit ready (ready means warm:
#      docs/serving.md) and HAProxy has had the cell UP for three polls in a row, then go on.
# Needs the rig's HAProxy stats on 127.0.0.1:8404 (compose.yaml publishes it there).
# Exit status: 0 done, 1 a cell did not drain or come back (the rollout stops there, the
# other cells keep serving).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
STATS="http://127.0.0.1:8404/stats;csv"  # deploy/contract.py INGRESS_STATS_PORT
DRAIN_TIMEOUT="${DRAIN_TIMEOUT:-300}"
READY_TIMEOUT="${READY_TIMEOUT:-1200}"
image=rufus-inference:cpu
CELLS=()
while (( $# )); do
  case "$1" in
    --image) image="$2"; shift ;;
    --image=*) image="${1#--image=}" ;;
    *) CELLS+=("$1") ;;
  esac
  shift
done
[[ ${#CELLS[@]} -gt 0 ]] || CELLS=(a b)
ALL=(a b)

say() { printf '[rolling_update %s] %s\n' "$(date +%H:%M:%S)" "$*"; }
compose() { bash "$ROOT/scripts/compose.sh" -- "$@"; }
svc() { if [[ "$2" == a ]]; then echo "$1"; else echo "$1-$2"; fi; }  # svc ROLE CELL
unit() { case "$1" in a) echo unit0 ;; b) echo unit1 ;; esac; }     # HAProxy server name

stats() { curl -fsS --max-time 5 "$STATS"; }
status_of() {  # UP / DOWN / MAINT ... of a cell's gRPC server at the ingress
  stats | awk -F, -v s="$(unit "$1")" '$1 == "units_lor" && $2 == s {print $18}'
}
streams_on() {  # streams HAProxy has open to a cell (gRPC + HTTP)
  stats | awk -F, -v s="$(unit "$1")" '($1 == "units_lor" || $1 == "units_http") && $2 == s {n += $5} END {print n + 0}'
}
wait_for() {  # wait_for SECONDS DESCRIPTION COMMAND...
  local deadline=$((SECONDS + $1)) what="$2"; shift 2
  until "$@"; do
    (( SECONDS < deadline )) || { say "$what: not reached in time"; return 1; }
    sleep 2
  done
}
is_up() { [[ "$(status_of "$1")" == UP* ]]; }
agent_healthy() {  # the agent's own verdict: every model of the unit ready (ready = warm)
  compose exec -T "$(svc agent "$1")" python /opt/rufus/docker/healthcheck.py agent >/dev/null 2>&1
}
back() {
  # HAProxy shows a server UP the moment its recreated container's name resolves again
  # ("start OK but check immediately"), before any check has passed: ask the agent, then
  # require HAProxy's UP on three polls in a row
  local n
  agent_healthy "$1" || return 1
  for n in 1 2 3; do is_up "$1" || return 1; sleep 2; done
}
is_down() { [[ "$(status_of "$1")" != UP* ]]; }
drained() { [[ "$(streams_on "$1")" == 0 ]]; }
others_up() {
  local c
  for c in "${ALL[@]}"; do [[ "$c" == "$1" ]] || back "$c" || return 1; done
}

stats >/dev/null || { say "cannot read the ingress's stats at $STATS (is the rig up?)"; exit 1; }
say "rolling ${CELLS[*]} to $image"
for cell in "${CELLS[@]}"; do
  leader="$(svc leader "$cell")" follower="$(svc follower "$cell")" agent="$(svc agent "$cell")"
  say "cell $cell: waiting until the other cells are in rotation"
  wait_for "$READY_TIMEOUT" "other cells in rotation" others_up "$cell" || exit 1
  t0=$SECONDS
  say "cell $cell: draining (stopping $agent takes it out of the ingress)"
  compose stop "$agent" >/dev/null 2>&1
  wait_for 60 "cell $cell out of rotation" is_down "$cell" || exit 1
  say "cell $cell: out of rotation after $((SECONDS - t0)) s; $(streams_on "$cell") stream(s) still open"
  wait_for "$DRAIN_TIMEOUT" "cell $cell drained" drained "$cell" || exit 1
  say "cell $cell: drained after $((SECONDS - t0)) s; recreating $leader $follower $agent on $image"
  bash "$ROOT/scripts/compose.sh" image "$cell" "$image"  # the cell's image from now on (rig.yaml)
  compose up -d --no-deps --no-build --force-recreate "$leader" "$follower" "$agent" >/dev/null 2>&1
  sleep 5  # let the old containers' addresses leave HAProxy's view first
  wait_for "$READY_TIMEOUT" "cell $cell back in rotation" back "$cell" || exit 1
  say "cell $cell: back in rotation on $image, $((SECONDS - t0)) s out"
done
say "done: ${CELLS[*]} on $image"
