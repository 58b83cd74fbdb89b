#!/usr/bin/env bash
# Sets up what the build, the tests and the demo need, and is cheap when all is there:
#   1. Debian packages listed in scripts/apt-packages.txt (installed with apt when root,
#      otherwise a message naming the missing ones and exit 1);
#   2. the Python venv built from requirements.txt. It lives outside the checkout, keyed by
#      the hash of requirements.txt (so fresh clones and CI reuse it), and is linked as .venv;
#      plus the cudnn-frontend headers in it (for USE_CUDNN=1 GPU builds).
# Environment: ATTN_VENV_ROOT (default ~/.cache/attn.c) is where venvs are kept;
#              SKIP_APT=1 skips step 1, SKIP_VENV=1 skips step 2.
set -euo pipefail
cd "$(dirname "$0")/.."

# --- 1. system packages -------------------------------------------------------------
if [ "${SKIP_APT:-0}" != 1 ] && command -v dpkg-query >/dev/null 2>&1; then
  missing=()
  while read -r pkg; do
    [ -z "$pkg" ] && continue
    case "$pkg" in \#*) continue ;; esac
    status=$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)
    [ "$status" = "install ok installed" ] || missing+=("$pkg")
  done < scripts/apt-packages.txt
  if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ]; then
      echo "setup: installing Debian packages: ${missing[*]}"
      export DEBIAN_FRONTEND=noninteractive
      apt-get install -y -q "${missing[@]}" >/dev/null 2>&1 ||
        { apt-get update -q >/dev/null && apt-get install -y -q "${missing[@]}" >/dev/null; }
    else
      echo "setup: missing Debian packages: ${missing[*]}" >&2
      echo "setup: install them with: sudo apt-get install ${missing[*]}" >&2
      exit 1
    fi
  fi
fi

# --- 2. Python venv -----------------------------------------------------------------
if [ "${SKIP_VENV:-0}" != 1 ]; then
  python=${PYTHON:-python3}
  command -v "$python" >/dev/null || { echo "setup: $python not found; install Python 3.10+" >&2; exit 1; }
  hash=$(sha256sum requirements.txt | cut -c1-12)
  root=${ATTN_VENV_ROOT:-$HOME/.cache/attn.c}
  venv="$root/venv-$hash"
  mkdir -p "$root"
  exec 9>"$root/.lock"
  flock 9   # concurrent runs (parallel make, several checkouts) wait for one builder
  if [ ! -f "$venv/.complete" ]; then
    echo "setup: creating Python venv $venv from requirements.txt (first time only)"
    rm -rf "$venv"   # an interrupted earlier attempt; venvs hard-code their path, so build in place
    "$python" -m venv "$venv"
    "$venv/bin/pip" install -q --upgrade pip
    "$venv/bin/pip" install -q -r requirements.txt
    touch "$venv/.complete"
  fi
  # The cudnn-frontend headers for USE_CUDNN=1 GPU builds (header-only C++; the Makefile finds
  # them in the venv). Installed without dependencies: the package's own ones (cutlass-dsl,
  # tvm-ffi) serve its Python bindings, not the headers; hence not in requirements.txt.
  cudnn_frontend=nvidia-cudnn-frontend==1.32.0
  if ! compgen -G "$venv/lib/python3*/site-packages/include/cudnn_frontend.h" >/dev/null; then
    "$venv/bin/pip" install -q --no-deps "$cudnn_frontend" ||
      echo "setup: could not install $cudnn_frontend (only USE_CUDNN=1 builds need it)" >&2
  fi
  if [ "$(readlink .venv 2>/dev/null || true)" != "$venv" ]; then
    rm -f .venv && ln -s "$venv" .venv
  fi
  flock -u 9
fi
