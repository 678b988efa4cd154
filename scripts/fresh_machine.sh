#!/usr/bin/env bash
# Start-time benchmarks as on a machine that never ran the project (issue 25):
#   - a fresh clone of this repository's HEAD in a new directory, with its own venv;
#   - a fresh, empty HOME: no ~/.cache/rufus (models, compile caches, precision), no
#     ~/.cache/vllm, ~/.cache/huggingface, ~/.triton or pip cache;
#   - torch inductor's default cache directory (/tmp/torchinductor_$USER) moved aside for the
#     run and put back afterwards; if anything but its precompiled_headers/ appears there, a
#     cache escaped RUFUS_COMPILE_CACHE_DIR, and the script says so. (torch fixes the
#     directory of the C++ precompiled header at import, in codecache._HEADER_DIR, ignoring
#     TORCHINDUCTOR_CACHE_DIR: a compile-time helper a cold start rebuilds in seconds; a
#     cached start compiles nothing and never reads it.)
# Then `make setup` (timed), scripts/bench_recovery.py (rufus_llm alone: first start, cached
# start, engine death to serving) and scripts/bench_first_request.py (make serve's three
# models: the first start compiles, the second is the "second start on a fresh machine";
# first request after ready vs steady state in both). Results land in OUT (default
# build/fresh-machine/<time>), the clone and HOME in a temporary directory removed at the end.
#
#   bash scripts/fresh_machine.sh [OUT]
#   bash scripts/fresh_machine.sh --wheelhouse build/wheels [OUT]   # install without PyPI
#
# Prefix ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 for the emulated AVX2 class.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WHEELHOUSE=()
if [[ "${1:-}" == --wheelhouse ]]; then WHEELHOUSE=(--wheelhouse "$(realpath "$2")"); shift 2; fi
OUT="$(realpath -m "${1:-$ROOT/build/fresh-machine/$(date -u +%Y%m%dT%H%M%SZ)}")"
WORK="$(mktemp -d /tmp/rufus-fresh-XXXXXX)"
INDUCTOR_DEFAULT="/tmp/torchinductor_$(id -un)"
mkdir -p "$OUT"

say() { printf '[fresh_machine %s] %s\n' "$(date +%H:%M:%S)" "$*" | tee -a "$OUT/summary.txt"; }

restore() {
  if [[ -d "$WORK/inductor-default" ]]; then  # the user's own, back in place of the run's
    rm -rf "$INDUCTOR_DEFAULT"
    mv "$WORK/inductor-default" "$INDUCTOR_DEFAULT"
  fi
  rm -rf "$WORK"
}
trap restore EXIT

if [[ -e "$INDUCTOR_DEFAULT" ]]; then
  mv "$INDUCTOR_DEFAULT" "$WORK/inductor-default"
fi
git clone -q "$ROOT" "$WORK/clone"
mkdir -p "$WORK/home"
export HOME="$WORK/home"
unset RUFUS_CACHE_DIR RUFUS_COMPILE_CACHE_DIR VLLM_CACHE_ROOT TORCHINDUCTOR_CACHE_DIR \
  TRITON_CACHE_DIR XDG_CACHE_HOME HF_HOME
cd "$WORK/clone"
say "fresh clone of $(git rev-parse --short HEAD) in $WORK/clone, HOME=$HOME; CPU: $(grep -o -w -E 'avx512f|avx512_bf16|amx_bf16|avx2' /proc/cpuinfo | sort -u | tr '\n' ' ')${ATEN_CPU_CAPABILITY:+(kernels capped: ATEN_CPU_CAPABILITY=$ATEN_CPU_CAPABILITY)}"

t0=$(date +%s)
if (( ${#WHEELHOUSE[@]} )); then  # `make setup` with the wheelhouse: setup.sh's flag
  bash scripts/setup.sh "${WHEELHOUSE[@]}" all > "$OUT/setup.log" 2>&1
else
  make setup > "$OUT/setup.log" 2>&1
fi
say "make setup: $(( $(date +%s) - t0 )) s (log: $OUT/setup.log)"

.venv/bin/python scripts/bench_recovery.py --variants uni --rounds 1 --streams 16 --death \
  --json "$OUT/bench_recovery.json" --log-dir "$OUT/bench_recovery_logs" \
  > "$OUT/bench_recovery.out" 2> "$OUT/bench_recovery.err"
say "rufus_llm alone (bench_recovery.py): $(tail -n 12 "$OUT/bench_recovery.out" | grep -E '^\| uni' || echo 'see bench_recovery.out')"

.venv/bin/python scripts/bench_first_request.py --steady 15 --starts 2 \
  --json "$OUT/first_request.json" --logs "$OUT/first_request_logs" \
  > "$OUT/first_request.out" 2> "$OUT/first_request.err"
say "three models (bench_first_request.py; start 1 compiles, start 2 is the second start):"
grep -E '^\| served' "$OUT/first_request.out" | tee -a "$OUT/summary.txt"

escaped="$(find "$INDUCTOR_DEFAULT" -mindepth 1 -maxdepth 1 ! -name precompiled_headers 2>/dev/null || true)"
if [[ -n "$escaped" ]]; then
  say "WARNING: in $INDUCTOR_DEFAULT: $(echo "$escaped" | tr '\n' ' '): a cache outside RUFUS_COMPILE_CACHE_DIR"
else
  say "inductor's default cache directory holds nothing but $( [[ -e "$INDUCTOR_DEFAULT" ]] && echo "its precompiled C++ header (torch's fixed place)" || echo "nothing (not recreated)"); every compile cache is under ~/.cache/rufus"
fi
say "caches written: $(du -sh "$HOME/.cache/rufus" 2>/dev/null | cut -f1) in ~/.cache/rufus; other dirs in HOME: $(cd "$HOME" && find . -maxdepth 2 -mindepth 1 -type d | grep -v '^./.cache/rufus' | tr '\n' ' ')"
