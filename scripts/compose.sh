#!/usr/bin/env bash
# The two-cell docker compose rig (docker/compose.yaml): `make compose-up` / `make compose-down`.
#
#   scripts/compose.sh up       # engine + image (scripts/image.sh) + both cells, ingress,
#                               # OpenAI frontend; waits until both cells are in rotation
#   scripts/compose.sh up --no-image   # the same with the images as they are
#   scripts/compose.sh up --prebuild MODE   # scripts/image.sh's --prebuild (default 1)
#   scripts/compose.sh up --kvcache-gb 1 --cell-a-cpus 0-3 --cell-b-cpus 4-7
#                               # vLLM's KV cache per node, GiB (2), and the cores of each
#                               # cell (default: the first and the second half of the host's)
#   scripts/compose.sh image CELL IMAGE   # run a cell (a, b) on IMAGE from its next
#                               # recreation (scripts/rolling_update.sh --image)
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
#
# The flags of `up` and `image` are kept in build/docker/rig.conf and rendered into
# build/docker/rig.yaml, a compose override every later command of the rig reads after
# docker/compose.yaml (which alone is the rig with its defaults, for plain `docker compose`).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
STATE="$ROOT/build/docker"
READY_TIMEOUT="${READY_TIMEOUT:-1200}"
say() { printf '[compose %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

compose() {
  local files=(-p rufus -f "$ROOT/docker/compose.yaml")
  [[ -s "$STATE/rig.yaml" ]] && files+=(-f "$STATE/rig.yaml")
  files+=(--profile cell-b)
  if docker compose version >/dev/null 2>&1; then docker compose "${files[@]}" "$@"
  else docker-compose "${files[@]}" "$@"; fi
}

# rig.conf: KVCACHE_GB, CELL_A_CPUS, CELL_B_CPUS, IMAGE_A, IMAGE_B (empty: compose.yaml's)
conf_get() { [[ -s "$STATE/rig.conf" ]] && sed -n "s/^$1=//p" "$STATE/rig.conf" | tail -1; return 0; }
conf_set() {  # conf_set KEY VALUE ...
  mkdir -p "$STATE"; touch "$STATE/rig.conf"
  while (( $# >= 2 )); do
    sed -i "/^$1=/d" "$STATE/rig.conf"; printf '%s=%s\n' "$1" "$2" >> "$STATE/rig.conf"; shift 2
  done
  render_rig
}
render_rig() {  # build/docker/rig.yaml from rig.conf
  local kv cpus image svc cell
  kv="$(conf_get KVCACHE_GB)"
  {
    echo "# written by scripts/compose.sh from build/docker/rig.conf; do not edit"
    echo "services:"
    for cell in a b; do
      cpus="$(conf_get "CELL_${cell^^}_CPUS")"; image="$(conf_get "IMAGE_${cell^^}")"
      for svc in leader follower agent; do
        [[ $cell == a ]] || svc="$svc-b"
        [[ $svc == agent* && -z "$image" ]] && continue  # nothing to change on it
        echo "  $svc:"
        [[ -n "$image" ]] && echo "    image: \"$image\""
        if [[ $svc != agent* ]]; then
          echo "    environment:"
          [[ -n "$cpus" ]] && echo "      VLLM_CPU_OMP_THREADS_BIND: \"$cpus\""
          echo "      VLLM_CPU_KVCACHE_SPACE: \"${kv:-2}\""
        fi
      done
    done
  } > "$STATE/rig.yaml.tmp"
  mv "$STATE/rig.yaml.tmp" "$STATE/rig.yaml"
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

up_flags() {  # parse up's flags into rig.conf; what is left goes to `compose up`
  local n a="" b="" kv=2
  n="$(nproc)"
  if (( n >= 2 )); then a="0-$((n / 2 - 1))"; b="$((n / 2))-$((n - 1))"; fi
  BUILD_IMAGE=1 REST=() PREBUILD=1
  while (( $# )); do
    case "$1" in
      --no-image) BUILD_IMAGE=0 ;;
      --prebuild) PREBUILD="$2"; shift ;;
      --kvcache-gb) kv="$2"; shift ;;
      --cell-a-cpus) a="$2"; shift ;;
      --cell-b-cpus) b="$2"; shift ;;
      *) REST+=("$1") ;;
    esac
    shift
  done
  [[ "$kv" =~ ^[0-9]+$ && "$kv" -ge 1 ]] || { say "--kvcache-gb: a whole number of GiB >= 1, not '$kv'"; exit 2; }
  rm -f "$STATE/rig.conf"  # a fresh rig: every cell on compose.yaml's image
  conf_set KVCACHE_GB "$kv" CELL_A_CPUS "$a" CELL_B_CPUS "$b"
}

cmd="${1:-up}"; shift || true
case "$cmd" in
  up)
    up_flags "$@"
    set -- ${REST[@]+"${REST[@]}"}
    bash "$ROOT/docker/engine.sh" start
    [[ $BUILD_IMAGE == 0 ]] || bash "$ROOT/scripts/image.sh" --prebuild "$PREBUILD"
    secrets
    start=$SECONDS
    compose up -d --no-build "$@"
    wait_ready
    say "rig up in $((SECONDS - start)) s"
    ;;
  down) secrets; compose down --remove-orphans --timeout 45 "$@" ;;
  wait) wait_ready ;;
  image)
    [[ "${1:-}" =~ ^[ab]$ && -n "${2:-}" ]] || { say "usage: compose.sh image CELL(a|b) IMAGE"; exit 2; }
    conf_set "IMAGE_${1^^}" "$2" ;;
  --) secrets; compose "$@" ;;  # compose itself, e.g. scripts/compose.sh -- up -d --no-deps leader
  *) secrets; compose "$cmd" "$@" ;;
esac
