#!/usr/bin/env bash
# Base images for docker/Dockerfile where no registry can be reached (the project's VMs: no
# Docker Hub, NGC or ECR). Prints the --build-arg flags to use.
#
#   docker/bases.sh            # public bases if present or pullable, else local ones
#   docker/bases.sh --local    # always the local ones
#
# Local bases are made from Debian's own packages: `debootstrap --variant=minbase bookworm`
# from the Debian mirror apt already uses, `docker import`ed as rufus-base/debian:12, and
# docker/base-python.Dockerfile on top of it (Debian 12's Python 3.11) as
# rufus-base/python:3.11-bookworm. They stand in for debian:12-slim and
# python:3.11-slim-bookworm: same Debian release and Python minor version, built once.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PUBLIC_PYTHON="${PUBLIC_PYTHON_IMAGE:-python:3.11.13-slim-bookworm}"
PUBLIC_DEBIAN="${PUBLIC_DEBIAN_IMAGE:-debian:12.12-slim}"
LOCAL_DEBIAN=rufus-base/debian:12
LOCAL_PYTHON=rufus-base/python:3.11-bookworm
say() { printf '[bases %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

have() { docker image inspect "$1" >/dev/null 2>&1; }
pullable() { have "$1" || timeout 60 docker pull -q "$1" >/dev/null 2>&1; }

mirror() {  # the Debian mirror apt on this host uses (deb822 `URIs:` or one-line `deb` sources)
  local m
  m="$( { sed -n -E 's/^URIs:[[:space:]]*([^[:space:]]+).*/\1/p' /etc/apt/sources.list.d/*.sources
          sed -n -E 's/^deb[[:space:]]+(\[[^]]*\][[:space:]]+)?([^[:space:]]+).*/\2/p' \
            /etc/apt/sources.list /etc/apt/sources.list.d/*.list; } 2>/dev/null \
       | grep -v security | head -1 || true)"
  echo "${m:-http://deb.debian.org/debian}"
}

local_bases() {
  if ! have "$LOCAL_DEBIAN"; then
    command -v debootstrap >/dev/null || { say "debootstrap missing (apt-get install debootstrap)"; exit 1; }
    local dir m
    dir="$(mktemp -d)"; m="$(mirror)"
    say "no public base image reachable: building $LOCAL_DEBIAN with debootstrap from $m (about a minute)"
    debootstrap --variant=minbase bookworm "$dir" "$m" >"$dir.log" 2>&1 \
      || { tail -20 "$dir.log" >&2; exit 1; }
    # the same suites as Debian's own images: the release, its updates and security
    printf 'deb %s bookworm main\ndeb %s bookworm-updates main\ndeb http://deb.debian.org/debian-security bookworm-security main\n' \
      "$m" "$m" > "$dir/etc/apt/sources.list"
    rm -rf "$dir/var/lib/apt/lists/"* "$dir/var/cache/apt/archives/"*.deb
    tar -C "$dir" -c . | docker import -c 'CMD ["bash"]' - "$LOCAL_DEBIAN" >/dev/null
    rm -rf "$dir" "$dir.log"
  fi
  if ! have "$LOCAL_PYTHON"; then
    say "building $LOCAL_PYTHON (Debian 12's Python 3.11)"
    DOCKER_BUILDKIT=0 docker build -q -f "$ROOT/docker/base-python.Dockerfile" \
      --build-arg DEBIAN_IMAGE="$LOCAL_DEBIAN" -t "$LOCAL_PYTHON" "$ROOT/docker" >/dev/null
  fi
  say "local bases: $LOCAL_PYTHON, $LOCAL_DEBIAN"
  echo "--build-arg PYTHON_IMAGE=$LOCAL_PYTHON --build-arg DEBIAN_IMAGE=$LOCAL_DEBIAN"
}

if [[ "${1:-}" != --local ]] && pullable "$PUBLIC_PYTHON" && pullable "$PUBLIC_DEBIAN"; then
  say "public bases: $PUBLIC_PYTHON, $PUBLIC_DEBIAN"
  echo ""
else
  local_bases
fi
