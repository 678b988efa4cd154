#!/usr/bin/env bash
# Issue 14's flakiness check: the engine-death tests N times in a row, each run a fresh
# tritonserver, and M more times after the whole of tests/integration/test_llm.py (whose last
# test is its own engine death). Prints one line per run and a summary; exit 1 if any failed.
#
#   scripts/repeat_death_tests.sh [N=15] [M=5]     (LOGS=<dir> keeps the logs: pytest --logs)
set -uo pipefail
if [[ "${1:-}" == -h || "${1:-}" == --help ]]; then
  sed -n '2,6p' "$0" | cut -c3-
  exit 0
fi
cd "$(dirname "$0")/.."
N=${1:-15}
M=${2:-5}
PY=.venv/bin/python
pass=0
fail=0
run() {  # label, pytest args...
  local label=$1
  shift
  local t0=$SECONDS
  local out
  out=$("$PY" -m pytest -q -s -p no:cacheprovider ${LOGS:+--logs "$LOGS"} "$@" 2>&1)
  local rc=$?
  local heal
  heal=$(grep -hoE "serving again after [0-9.]+ s|serving again [0-9.]+ s after its engine died" <<<"$out" | tr '\n' ';')
  if [ $rc -eq 0 ]; then pass=$((pass + 1)); else fail=$((fail + 1)); fi
  echo "[repeat_death_tests $(date -u +%H:%M:%S)] $label: rc=$rc $((SECONDS - t0)) s; $heal load $(cut -d' ' -f1 /proc/loadavg)"
  [ $rc -eq 0 ] || tail -30 <<<"$out"
}
for i in $(seq 1 "$N"); do run "test_recovery.py run $i/$N" tests/integration/test_recovery.py; done
for i in $(seq 1 "$M"); do run "test_llm.py (whole module) run $i/$M" tests/integration/test_llm.py; done
echo "[repeat_death_tests] $pass passed, $fail failed of $((N + M)) runs"
[ $fail -eq 0 ]
