#!/usr/bin/env bash
# A fresh container (never started) from the image's prebuilt caches to every model ready
# (issue 25, "pre-build in the image"): `docker run` of a one-node unit, then Triton's model
# ready endpoints polled every 0.2 s from the host; ready means warm (each model served its
# warm-up first). Prints the seconds and whether vLLM loaded its AOT artefact or compiled.
#
#   bash scripts/bench_container_start.sh [MODELS] [IMAGE]
#   MODELS default rufus_llm,rufus_qp_medusa,rufus_assistant; IMAGE rufus-inference:cpu
# Needs a running engine (bash docker/engine.sh start) and the image (make image).
set -euo pipefail
MODELS="${1:-rufus_llm,rufus_qp_medusa,rufus_assistant}"
IMAGE="${2:-rufus-inference:cpu}"
NAME="rufus-start-bench-$$"
trap 'docker rm -f "$NAME" >/dev/null 2>&1 || true' EXIT

t0=$(date +%s%N)
since() { local ms=$(( ($(date +%s%N) - t0) / 1000000 )); printf '%d.%d' $((ms / 1000)) $(((ms % 1000) / 100)); }
docker run -d --name "$NAME" --shm-size 2g -p 127.0.0.1::8000 \
  -e RUFUS_MODELS="$MODELS" "$IMAGE" >/dev/null
port="$(docker port "$NAME" 8000/tcp | head -1 | sed 's/.*://')"
pending="${MODELS//,/ }"
while [[ -n "${pending// /}" ]]; do
  if [[ "$(docker inspect -f '{{.State.Running}}' "$NAME")" != true ]]; then
    echo "container exited:" >&2; docker logs --tail 30 "$NAME" >&2; exit 1
  fi
  for m in $pending; do
    if curl -sf -o /dev/null "http://127.0.0.1:$port/v2/models/$m/ready"; then
      printf '%s ready after %s s\n' "$m" "$(since)"
      pending="${pending/$m/}"
    fi
  done
  sleep 0.2
done
printf 'all ready (%s) %s s after docker run; CPU: %s\n' "$MODELS" "$(since)" \
  "$(grep -o -w -E 'avx512f|avx512_bf16|amx_bf16' /proc/cpuinfo | sort -u | tr '\n' ' ')"
docker logs "$NAME" 2>&1 | grep -E "Directly load AOT|Compiling a graph|compile warm-up with|engine ready in" \
  | sed 's/^/  log: /' | cut -c1-200 || true
