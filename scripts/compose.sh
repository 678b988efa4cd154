#!/usr/bin/env bash
# The two-cell docker compose rig (docker/compose.yaml): `make compose-up` / `make compose-down`.
#
#   scripts/compose.sh up       # engine + image (scripts/image.sh) + both cells, ingress,
#                               # OpenAI frontend; waits until both cells are in rotation
#   scripts/compose.sh up --no-image   # the same with the images as they are
#   scripts/compose.sh down     # stop and remove the rig's containers and network
#   scripts/compose.sh wait     # until both cells are in the ingress's rotation
#   scripts/compose.sh ps | logs [service] | exec ...   # passed to compose
#   scripts/compose.sh -- ARGS...   # compose ARGS as they are (`up` above is more than that)
#
# Works with compose v2 (`docker compose`) and docker-compose 1.29 (Debian 12), project name
# `rufus`. Secrets come from the environment (SECURITY.md): RUFUS_UNIT_SECRET (the nodes'
# shared secret) and RUFUS_ADMIN_KEY (optional). Where RUFUS_UNIT_SECRET is unset, `up`
# makes a random one for this rig and keeps it in build/docker/rig.env (mode 600, not in the
# image, not in git) so that later commands (rolling update, down) use the same one.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
STATE="${RUFUS_DOCKER_STATE:-$ROOT/build/docker}"
READY_TIMEOUT="${READY_TIMEOUT:-1200}"
say() { printf '[compose %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

compose() {
  local files=(-p rufus -f "$ROOT/docker/compose.yaml" --profile cell-b)
  if docker compose version >/dev/null 2>&1; then docker compose "${files[@]}" "$@"
  else docker-compose "${files[@]}" "$@"; fi
}

secrets() {
  if [[ -z "${RUFUS_UNIT_SECRET:-}" ]]; then
    mkdir -p "$STATE"
    if [[ ! -s "$STATE/rig.env" ]]; then
      (umask 077; printf 'RUFUS_UNIT_SECRET=%s\n' "$(od -An -tx1 -N32 /dev/urandom | tr -d ' \n')" > "$STATE/rig.env")
      say "made a unit secret for this rig in $STATE/rig.env (set RUFUS_UNIT_SECRET to use yours)"
    fi
    set -a; . "$STATE/rig.env"; set +a
  fi
  export RUFUS_UNIT_SECRET
}

in_rotation() {  # the number of units HAProxy has UP in the gRPC backend
  curl -fsS --max-time 5 "http://127.0.0.1:8404/stats;csv" 2>/dev/null \
    | awk -F, '$1 == "units_lor" && $2 ~ /^unit/ && $18 ~ /^UP/ {n++} END {print n + 0}'
}

healthy_agents() {  # unit agents whose container health check passes (all models ready)
  local n=0 svc id
  for svc in agent agent-b; do
    id="$(compose ps -q "$svc" 2>/dev/null)"
    [[ -n "$id" && "$(docker inspect -f '{{if .State.Health}}{{.State.Health.Status}}{{end}}' "$id" 2>/dev/null)" == healthy ]] \
      && n=$((n + 1))
  done
  echo "$n"
}

wait_ready() {
  # HAProxy shows a server UP before its first check has run: count a cell only when its
  # agent's container is healthy too
  local deadline=$((SECONDS + READY_TIMEOUT)) n h last="" openai
  while :; do
    n="$(in_rotation)"; h="$(healthy_agents)"
    openai="$(curl -fsS -o /dev/null -w '%{http_code}' --max-time 5 http://127.0.0.1:9000/health 2>/dev/null || true)"
    [[ "$n/$h" != "$last" ]] && { say "cells: $h of 2 healthy, $n of 2 in the ingress's rotation"; last="$n/$h"; }
    [[ "$n" -ge 2 && "$h" -ge 2 && "$openai" == 200 ]] && break
    if (( SECONDS >= deadline )); then
      say "not ready after ${READY_TIMEOUT}s:"; compose ps >&2; exit 1
    fi
    sleep 5
  done
  say "ready: gRPC localhost:8001, OpenAI http://localhost:9000/v1, Triton HTTP 127.0.0.1:8000, HAProxy stats http://127.0.0.1:8404/stats"
}

split_cores() {  # one half of the host's cores per cell, unless the operator set them
  local n; n="$(nproc)"
  if (( n >= 2 )); then
    : "${RUFUS_CELL_A_CPUS:=0-$((n / 2 - 1))}" "${RUFUS_CELL_B_CPUS:=$((n / 2))-$((n - 1))}"
    export RUFUS_CELL_A_CPUS RUFUS_CELL_B_CPUS
  fi
}
split_cores

cmd="${1:-up}"; shift || true
case "$cmd" in
  up)
    bash "$ROOT/docker/engine.sh" start
    if [[ "${1:-}" == --no-image ]]; then shift; else bash "$ROOT/scripts/image.sh"; fi
    secrets
    start=$SECONDS
    compose up -d --no-build "$@"
    wait_ready
    say "rig up in $((SECONDS - start)) s"
    ;;
  down) secrets; compose down --remove-orphans --timeout 45 "$@" ;;
  wait) wait_ready ;;
  --) secrets; compose "$@" ;;  # compose itself, e.g. scripts/compose.sh -- up -d --no-deps leader
  *) secrets; compose "$cmd" "$@" ;;
esac
