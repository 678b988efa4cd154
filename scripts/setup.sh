#!/usr/bin/env bash
# One-time (idempotent) setup: .venv with pinned dependencies, tritonserver with the Python
# backend from the nvidia-pytriton wheel, and the default model. Each step is skipped when
# its stamp says it is already done.
#
#   scripts/setup.sh            everything
#   scripts/setup.sh venv       only the virtual environment
#   scripts/setup.sh verify     everything, hashing every built file (not only changed ones)
#
# Flags, before the step:
#   --wheelhouse DIR   install from this directory of wheels, no package index (the image
#                      build's, scripts/image.sh; scripts/fresh_machine.sh)
#   --no-venv-cache    pip install the venv, and keep no copy of it under the cache
#                      directory (the image build: a copy would only grow the image)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
WHEELHOUSE="" VENV_CACHE=1
while [[ "${1:-}" == --* ]]; do
  case "$1" in
    --wheelhouse) WHEELHOUSE="$2"; shift 2 ;;
    --no-venv-cache) VENV_CACHE=0; shift ;;
    *) echo "unknown flag $1 (--wheelhouse DIR, --no-venv-cache)" >&2; exit 2 ;;
  esac
done
BUILD="$ROOT/build"
PY="${PYTHON:-python3.11}"
command -v "$PY" >/dev/null 2>&1 || PY=python3

# pip on these machines warns once per package about an unused local index: hide that noise.
quiet_pip() { "$@" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2); }

step() { printf '\n\033[1m[setup %s] %s\033[0m\n' "$(date +%H:%M:%S)" "$*"; }

# A wheelhouse (a directory of the lock's wheels, e.g. the Docker build's, scripts/image.sh)
# replaces the package index for every pip call below and in the scripts it runs: no index,
# no TLS trust store needed, reproducible.
if [[ -n "$WHEELHOUSE" ]] && compgen -G "$WHEELHOUSE/*.whl" >/dev/null; then
  export PIP_NO_INDEX=1 PIP_FIND_LINKS="$WHEELHOUSE"
  printf '[setup] installing from the wheelhouse %s (no package index)\n' "$WHEELHOUSE"
fi

# the lock's key: the files' contents only (sha256sum's output would name the clone's path)
lock_hash() { cat "$ROOT/requirements.lock" "$ROOT/pyproject.toml" | sha256sum | cut -c1-16; }

# venv_cache_dir PYTHON: where the venv of this lock and that interpreter's version is kept
# (nothing with --no-venv-cache)
venv_cache_dir() {
  [[ "$VENV_CACHE" != 0 ]] || return 0
  local pyver
  pyver="$("$1" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')"
  echo "${RUFUS_CACHE_DIR:-$HOME/.cache/rufus}/venvs/py$pyver-$(lock_hash)"
}

setup_venv() {
  local want have
  want="$(lock_hash)"
  have="$(cat "$VENV/.rufus-lock" 2>/dev/null || true)"
  if [[ "$want" == "$have" && -x "$VENV/bin/python" ]]; then
    step "venv up to date ($VENV)"
    return
  fi
  # A venv installed once per lock (and Python) is kept in the cache, as the models and the
  # image's wheelhouse are: a new clone's venv is made of hard links to it (copies across
  # filesystems) in seconds instead of minutes of pip. --no-venv-cache: pip every time.
  local cache
  cache="$(venv_cache_dir "$PY")"
  if [[ -n "$cache" && -f "$cache/.complete" && ! -e "$VENV" ]]; then
    step "venv from the cache: $cache (hard links)"
    cp -al "$cache" "$VENV" 2>/dev/null || { rm -rf "$VENV"; cp -a "$cache" "$VENV"; }
    relocate_venv "$VENV" "$cache" "$VENV"
  else
    step "creating $VENV and installing requirements.lock (about 2-4 minutes)"
    [[ -x "$VENV/bin/python" ]] || "$PY" -m venv "$VENV"
    quiet_pip "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --progress-bar off \
      --no-deps -r "$ROOT/requirements.lock"
    # The three torch add-ons must stay absent (see requirements.lock).
    "$VENV/bin/python" -m pip uninstall --quiet -y torchvision torchaudio torchcodec 2>/dev/null || true
    rm -f "$(venv_site "$VENV")/rufus-project.pth" "$VENV/.rufus-lock" "$VENV/.complete"
    if [[ -n "$cache" && ! -f "$cache/.complete" ]]; then
      rm -rf "$cache.tmp" && mkdir -p "$(dirname "$cache")"
      if cp -al "$VENV" "$cache.tmp" 2>/dev/null || { rm -rf "$cache.tmp"; cp -a "$VENV" "$cache.tmp"; }; then
        relocate_venv "$cache.tmp" "$VENV" "$cache"
        rm -rf "$cache" && mv "$cache.tmp" "$cache" && touch "$cache/.complete"
        step "venv kept in the cache for the next clone: $cache"
      fi
    fi
  fi
  # The project itself (rufus/, follower/, proxy/) is put on the venv's path with a .pth
  # file: an editable install without build tools. The Triton stub gets it via PYTHONPATH.
  echo "$ROOT" > "$(venv_site "$VENV")/rufus-project.pth"
  echo "$want" > "$VENV/.rufus-lock"
}

venv_site() { "$1/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'; }

# relocate_venv DIR FROM TO: the venv copied into DIR names its home FROM in its scripts'
# first lines and activate scripts: point them at TO. sed -i writes new files, so the hard
# links of those few files are broken and the other copy is left as it was.
relocate_venv() {
  local dir="$1" from="$2" to="$3" f
  for f in "$dir"/bin/*; do
    [[ -f "$f" && ! -L "$f" ]] || continue
    if head -c 2 "$f" | grep -q '#!' || [[ "$f" == */activate* ]]; then
      grep -q -F "$from" "$f" && sed -i "s|$from|$to|g" "$f"
    fi
  done
  return 0
}

# shared_venv: the venv cache this .venv was linked from (setup_venv), if it is still there
# and of the same lock; else nothing.
shared_venv() {
  local cache
  cache="$(venv_cache_dir "$VENV/bin/python")"
  if [[ -n "$cache" && -f "$cache/.complete" \
        && "$(cat "$VENV/.rufus-lock" 2>/dev/null)" == "$(lock_hash)" ]]; then
    echo "$cache"
  fi
}

setup_triton() {
  local site stubs shared
  site="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  # The stub imports torch and vLLM from the shared venv cache where .venv is linked from it
  # (the same files): inductor keys its compiled C++ kernels by their build command, which
  # names torch's directory, so a stub importing from each clone's own path rebuilt them on
  # the clone's first start (vLLM's compile warm-up 16 s instead of 2-4 s; a new clone's
  # first `make serve` 42 s instead of 20 s: docs/benchmarks.md).
  shared="$(shared_venv)"
  if [[ -n "$shared" && -d "$shared${site#"$VENV"}" ]]; then
    site="$shared${site#"$VENV"}"
  fi
  stubs="$site/pytriton/tritonserver"
  local pyver
  pyver="$("$VENV/bin/python" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')"
  local dest="$BUILD/triton/backends/python"
  if [[ -x "$dest/triton_python_backend_stub" && "$dest/libtriton_python.so" -nt "$stubs/backends/python/libtriton_python.so" ]]; then
    step "tritonserver Python backend ready ($dest)"
  else
    step "preparing tritonserver Python backend for Python $pyver"
    mkdir -p "$dest"
    cp "$stubs/backends/python/libtriton_python.so" "$stubs/backends/python/triton_python_backend_utils.py" "$dest/"
    cp "$stubs/python_backend_stubs/$pyver/triton_python_backend_stub" "$dest/"
    chmod +x "$dest/triton_python_backend_stub"
  fi
  "$VENV/bin/python" - <<EOF
import json, sysconfig
env = {
  "tritonserver": "$stubs/bin/tritonserver",
  "backend_directory": "$BUILD/triton/backends",
  "ld_library_path": sysconfig.get_config_var("LIBDIR") + ":$site/nvidia_pytriton.libs",
  "pythonpath": "$ROOT:$site",
}
open("$BUILD/triton/env.json", "w").write(json.dumps(env, indent=1))
EOF
}

setup_model() {
  step "default model (SmolLM2-135M-Instruct, bf16 Hugging Face directory)"
  "$VENV/bin/python" "$ROOT/scripts/build_model.py"
}

setup_qp() {
  # Query planner (issue 6): merge the committed LoRA into the default model and build vLLM's
  # Medusa checkpoint from the committed heads. Seconds; retraining is scripts/train_*.py.
  step "query planner model + Medusa heads (rufus_qp_medusa)"
  "$VENV/bin/python" -m rufus.qp.build
}

setup_catalog() {
  # Shopping assistant (issue 16): the default product catalog (data/catalog/) and its SQLite
  # FTS5 index (build/retrieval/, about a second). Rebuilt when the data or index code changed;
  # RUFUS_CATALOG=<file.jsonl|csv> indexes your own catalog instead.
  local idx="${RUFUS_CATALOG_INDEX:-$BUILD/retrieval/catalog.sqlite}" newer=1 f
  for f in "$ROOT"/rufus/retrieval/{catalog,catalog_data,sqlite_fts}.py "$ROOT"/data/catalog/*.jsonl; do
    [[ -f "$idx" && "$idx" -nt "$f" ]] || newer=0
  done
  if [[ -z "${RUFUS_CATALOG:-}" && $newer = 1 ]]; then
    step "product catalog index ready ($idx)"
    return
  fi
  step "product catalog + search index (rufus_assistant)"
  "$VENV/bin/python" "$ROOT/scripts/build_catalog.py" --index "$idx" ${RUFUS_CATALOG:+--catalog "$RUFUS_CATALOG"}
}

setup_precision() {
  # Precision by measurement (rufus/machine/precision.py): bf16 / fp32 (/ int8 weight-only for
  # the planner) passes of the default model and the planner on this CPU, and the planner's
  # Medusa tree grown on those costs (under a minute natively, about one on AVX2), cached per
  # CPU and model under $RUFUS_CACHE_DIR/precision/; "measured" in a model.json uses it.
  step "precision for this CPU (measured once per CPU class and model)"
  "$VENV/bin/python" -m rufus.launch.setup_precision
}

setup_w8a8() {
  # The default model as a compressed-tensors W8A8 checkpoint for vLLM's CPU int8 kernel
  # (rufus/launch/w8a8.py; docs/precision.md): rufus_llm serves it where the CPU has int8 dot
  # products (VNNI, AMX). Written on every machine (an image built on one class runs on
  # others); about 15 s, then kept (checksummed).
  step "W8A8 int8 copy of the default model (served where the CPU has VNNI or AMX)"
  "$VENV/bin/python" -m rufus.launch.w8a8
}

setup_proxy() {
  # Proxy layer (issue 5): HAProxy from Debian for the data path. Installed when missing and
  # we are root; otherwise a note (the proxy integration tests then skip, saying why).
  if command -v haproxy >/dev/null 2>&1 || [[ -x /usr/sbin/haproxy ]]; then
    step "haproxy present ($(/usr/sbin/haproxy -v 2>/dev/null | head -1 | cut -d' ' -f1-3))"
  elif [[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null 2>&1; then
    step "installing haproxy (Debian) for the proxy layer"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq haproxy >/dev/null \
      || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq haproxy >/dev/null; } \
      || echo "haproxy install failed: proxy tests will skip" >&2
  else
    echo "haproxy missing and not root: run 'apt-get install haproxy' (proxy tests will skip)" >&2
  fi
}

setup_promtool() {
  # Observability (issue 59): promtool, from Debian's prometheus package, checks and unit-tests
  # the alert rules (observe/rules/; tests/unit/test_observe_rules.py). Installed when missing
  # and we are root; otherwise a note (those tests then skip, saying why).
  if command -v promtool >/dev/null 2>&1; then
    step "promtool present ($(promtool --version 2>/dev/null | head -1 | cut -d' ' -f1-3))"
  elif [[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null 2>&1; then
    step "installing prometheus (Debian) for promtool: the alert rules' tests"
    local apt=(env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends)
    "${apt[@]}" prometheus >/dev/null \
      || { apt-get update -qq && "${apt[@]}" prometheus >/dev/null; } \
      || echo "prometheus install failed: the rules tests will fail (no promtool)" >&2
  else
    echo "promtool missing and not root: 'apt-get install prometheus' (the rules tests skip)" >&2
  fi
}

setup_verify() {
  # Checks on a cached start read a built file again only when its stat changed
  # (rufus/machine/fingerprint.py): this forgets those fingerprints, so the steps after it
  # hash every model file, catching corruption no write through the filesystem made.
  step "forgetting the stat fingerprints: every built file is hashed again"
  "$VENV/bin/python" -c 'from rufus.machine import fingerprint; fingerprint.forget()'
}

case "${1:-all}" in
  venv) setup_venv ;;
  triton) setup_venv; setup_triton ;;
  model) setup_venv; setup_model ;;
  qp) setup_venv; setup_model; setup_qp ;;
  proxy) setup_proxy ;;
  promtool) setup_promtool ;;
  catalog) setup_venv; setup_catalog ;;
  precision) setup_venv; setup_model; setup_qp; setup_precision ;;
  w8a8) setup_venv; setup_model; setup_w8a8 ;;
  all) setup_venv; setup_triton; setup_model; setup_qp; setup_w8a8; setup_precision; setup_catalog; setup_proxy; setup_promtool ;;
  verify) setup_venv; setup_verify; setup_triton; setup_model; setup_qp; setup_w8a8; setup_precision; setup_catalog ;;
  *) echo "usage: $0 [all|verify|venv|triton|model|qp|catalog|precision|w8a8|proxy|promtool]" >&2; exit 2 ;;
esac
