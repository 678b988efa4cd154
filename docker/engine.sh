#!/usr/bin/env bash
# A Docker engine for `make image` / `make compose-up` and the container tests, on machines
# without systemd (the project's VMs and CI): install Debian's engine if it is missing, start
# dockerd ourselves and stop it by its pid. An engine that is already running (a desktop, a
# systemd host) is used as it is and never stopped by us.
#
#   docker/engine.sh start    # idempotent; prints nothing but progress
#   docker/engine.sh stop     # only a daemon this script started
#   docker/engine.sh status
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
STATE="$ROOT/build/docker"
PIDFILE="$STATE/dockerd.pid"
say() { printf '[engine %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

up() { timeout 10 docker info >/dev/null 2>&1; }

install_engine() {
  if command -v dockerd >/dev/null && command -v debootstrap >/dev/null \
     && { command -v docker-compose >/dev/null || docker compose version >/dev/null 2>&1; }; then
    return
  fi
  if [[ "$(id -u)" != 0 ]] || ! command -v apt-get >/dev/null; then
    say "no Docker engine and cannot install one (needs root and apt-get): install docker.io,"
    say "docker-compose (or the compose v2 plugin) and debootstrap, then run this again"
    exit 1
  fi
  say "installing Debian's Docker engine, docker-compose and debootstrap (about a minute)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -qq docker.io docker-compose debootstrap >/dev/null 2>&1 \
    || { apt-get update -qq && apt-get install -y -qq docker.io docker-compose debootstrap >/dev/null; }
}

start() {
  install_engine
  if up; then say "Docker engine running ($(docker info -f '{{.ServerVersion}}'))"; return; fi
  mkdir -p "$STATE"
  say "starting dockerd (log: $STATE/dockerd.log)"
  setsid dockerd >"$STATE/dockerd.log" 2>&1 < /dev/null &
  echo $! > "$PIDFILE"
  for _ in $(seq 60); do up && { say "dockerd ready (pid $(cat "$PIDFILE"))"; return; }; sleep 1; done
  say "dockerd did not come up in 60 s: tail of $STATE/dockerd.log:"; tail -20 "$STATE/dockerd.log" >&2
  exit 1
}

stop() {
  [[ -f "$PIDFILE" ]] || { say "no dockerd started by this script"; return; }
  local pid; pid="$(cat "$PIDFILE")"
  if kill -0 "$pid" 2>/dev/null; then
    say "stopping dockerd (pid $pid)"
    kill -TERM "$pid"
    for _ in $(seq 30); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
    kill -0 "$pid" 2>/dev/null && kill -KILL "$pid"
  fi
  rm -f "$PIDFILE"
}

case "${1:-start}" in
  start) start ;;
  stop) stop ;;
  status) if up; then docker info -f 'Docker {{.ServerVersion}}, {{.Containers}} containers, {{.Images}} images'; else echo "not running"; exit 1; fi ;;
  *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
