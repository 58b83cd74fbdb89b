#!/usr/bin/env bash
# Sets up what the build, the tests and the demo need, and is cheap when all is there:
#   1. Debian packages listed in scripts/apt-packages.txt (installed with apt when root,
#      otherwise a message naming the missing ones and exit 1);
#   2. the Python venv built from requirements.txt, with this checkout's packages (pyproject.toml)
#      installed editable. It lives outside the checkout, keyed by
#      the hash of requirements.txt (so fresh clones and CI reuse it), and is linked as .venv;
#      plus the cudnn-frontend headers in it (for USE_CUDNN=1 GPU builds).
# Both files are split into tiers ("# tier: NAME" lines); a tier is installed with every tier
# above it:
#   bash scripts/setup.sh --tier demo   what `make demo` needs (~25 s on a fresh machine)
#   bash scripts/setup.sh               everything (--tier full): make test, the references, scripts/
# A .venv that already links a venv of this requirements.txt with the tier asked for (or a higher
# one) is kept, wherever it is; when .venv is re-pointed, setup says from what to what.
# Environment: ATTN_VENV_ROOT (default ~/.cache/attn.c) is where venvs are kept;
#              SKIP_APT=1 skips step 1, SKIP_VENV=1 skips step 2.
set -euo pipefail
cd "$(dirname "$0")/.."

tier=full
while [ $# -gt 0 ]; do
  case "$1" in
    --tier) [ $# -ge 2 ] || { echo "setup: --tier needs a value (demo or full)" >&2; exit 2; }
            tier=$2; shift 2 ;;
    --tier=*) tier=${1#--tier=}; shift ;;
    -h|--help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; exit 0 ;;   # the comment above
    *) echo "setup: unknown argument '$1' (usage: scripts/setup.sh [--tier demo|full])" >&2; exit 2 ;;
  esac
done

# The lines of FILE's tiers up to and including $tier, without comments and blank lines.
tier_lines() {
  awk -v want="$tier" -v file="$1" '
    /^# tier: / { if (found) exit; if ($3 == want) found = 1; next }
    /^[[:space:]]*(#|$)/ { next }
    { sub(/[[:space:]]+#.*/, ""); print }
    END { if (!found) { print "setup: no tier \"" want "\" in " file > "/dev/stderr"; exit 3 } }' "$1"
}
# (validate the tier name once, against requirements.txt)
tier_lines requirements.txt >/dev/null || exit 2
# Whether venv DIR holds $tier: its marker .complete-TIER, or that of a later tier (each includes
# the ones above it), or .complete (older setups: everything).
has_tier() {
  local t found=0
  [ -f "$1/.complete" ] && return 0
  for t in $(awk '/^# tier: / { print $3 }' requirements.txt); do
    [ "$t" = "$tier" ] && found=1
    [ $found = 1 ] && [ -f "$1/.complete-$t" ] && return 0
  done
  return 1
}
# The tiers venv DIR holds, for messages: "tiers demo, full", "no tier".
tiers_of() {
  local f names=
  for f in "$1/.complete" "$1"/.complete-*; do
    [ -f "$f" ] || continue
    f=${f##*/.complete}; f=${f#-}
    names+="${names:+, }${f:-all}"
  done
  if [ -n "$names" ]; then echo "tiers $names"; else echo "no tier"; fi
}

# Installs packages into venv DIR: with uv (from PyPI, into the venv) where it can be had, else
# with pip. uv downloads in parallel and unpacks faster: the full tier from PyPI in 46 s wall
# and 83 CPU-s against pip's 123 s and 120 (2-core EPYC, 2026-12-08), the same versions. Both
# compile every module to bytecode (not skipped: where PYTHONDONTWRITEBYTECODE is set, as on this
# project's machines, Python would compile torch again in every process that imports it, ~180
# CPU-s more a make test). uv does not read pip's configuration: the index and find-links of
# PIP_INDEX_URL, PIP_EXTRA_INDEX_URL, PIP_FIND_LINKS and `pip config` are passed on; where uv
# fails (a proxy's certificate, an index it cannot reach), pip installs. ATTN_SETUP_PIP=1: pip only.
install_packages() {  # VENV PACKAGE...
  local venv=$1 args=()
  shift
  if [ "${ATTN_SETUP_PIP:-0}" != 1 ] &&
     { [ -x "$venv/bin/uv" ] || { "$venv/bin/pip" install -q --disable-pip-version-check uv >/dev/null 2>&1 &&
                                   [ -x "$venv/bin/uv" ]; }; }; then
    local index
    index=${PIP_INDEX_URL:-$("$venv/bin/pip" config get global.index-url 2>/dev/null || true)}
    [ -n "$index" ] && args+=(--index-url "$index")
    [ -n "${PIP_EXTRA_INDEX_URL:-}" ] && args+=(--extra-index-url "$PIP_EXTRA_INDEX_URL")
    [ -n "${PIP_FIND_LINKS:-}" ] && args+=(--find-links "$PIP_FIND_LINKS")
    "$venv/bin/uv" pip install -q --python "$venv/bin/python" --compile-bytecode "${args[@]}" "$@" && return 0
    echo "setup: uv could not install them; pip will" >&2
  fi
  "$venv/bin/pip" install -q --disable-pip-version-check "$@"
}

# --- 1. system packages -------------------------------------------------------------
if [ "${SKIP_APT:-0}" != 1 ] && command -v dpkg-query >/dev/null 2>&1; then
  missing=()
  while read -r pkg; do
    status=$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)
    [ "$status" = "install ok installed" ] || missing+=("$pkg")
  done < <(tier_lines scripts/apt-packages.txt)
  if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ]; then
      echo "setup: installing Debian packages: ${missing[*]} (tens of MB, under a minute with a reachable mirror)"
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
  # .venv as it is, if it serves: a shell with another ATTN_VENV_ROOT must not swap the full tier
  # (PyTorch, transformers, lm_eval) for a fresh demo tier behind the user's back
  linked=$(readlink .venv 2>/dev/null || true)
  if [ -n "$linked" ] && [ "$linked" != "$venv" ] && [ "${linked##*/}" = "venv-$hash" ] && has_tier "$linked"; then
    venv=$linked root=$(dirname "$linked")
  fi
  mkdir -p "$root"
  exec 9>"$root/.lock"
  flock 9   # concurrent runs (parallel make, several checkouts) wait for one builder
  if ! has_tier "$venv"; then
    if [ ! -x "$venv/bin/pip" ]; then
      echo "setup: creating Python venv $venv (first time only)"
      rm -rf "$venv"   # an interrupted earlier attempt; venvs hard-code their path, so build in place
      "$python" -m venv "$venv"
    fi
    case "$tier" in   # what it costs (measured on a 2-core machine, 2026-12-02, 12-03 and, with uv, 12-08)
      demo) about="numpy, sentencepiece: about 70 MB, some 20 s" ;;
      *) about="PyTorch with its CUDA libraries, transformers, lm-eval, matplotlib: about 6.5 GB, about a minute from PyPI with uv, two with pip" ;;
    esac
    echo "setup: installing the '$tier' tier of requirements.txt into $venv ($about)"
    mapfile -t packages < <(tier_lines requirements.txt)
    install_packages "$venv" "${packages[@]}"
    touch "$venv/.complete-$tier"
  fi
  if [ "$tier" = full ]; then
    # The cudnn-frontend headers for USE_CUDNN=1 GPU builds (header-only C++; the Makefile finds
    # them in the venv). Installed without dependencies: the package's own ones (cutlass-dsl,
    # tvm-ffi) serve its Python bindings, not the headers; hence not in requirements.txt.
    cudnn_frontend=nvidia-cudnn-frontend==1.32.0
    if ! compgen -G "$venv/lib/python3*/site-packages/include/cudnn_frontend.h" >/dev/null; then
      "$venv/bin/pip" install -q --disable-pip-version-check --no-deps "$cudnn_frontend" ||
        echo "setup: could not install $cudnn_frontend (only USE_CUDNN=1 builds need it)" >&2
    fi
  fi
  # attnref and study as editable packages (pyproject.toml), so that `import attnref` and
  # `python -m study` work from any directory; redone only when the venv's install names another
  # checkout (several may share the venv; the Makefile puts its own checkout first regardless)
  here=$(pwd -P)
  # (-I: asked without PYTHONPATH, which make sets to the checkout: the docs' commands run without it)
  installed=$(cd / && "$venv/bin/python" -I -c 'import os, study; print(os.path.dirname(os.path.dirname(os.path.realpath(study.__file__))))' 2>/dev/null || true)
  if [ "$installed" != "$here" ]; then
    echo "setup: installing attnref and study from $here into $venv (editable, seconds)"
    # (with the venv's setuptools when it can build an editable wheel, >= 70.1; else pip fetches one)
    "$venv/bin/pip" install -q --disable-pip-version-check --no-deps --no-build-isolation -e . >/dev/null 2>&1 ||
      "$venv/bin/pip" install -q --disable-pip-version-check --no-deps -e . >/dev/null ||
      echo "setup: could not install them editable: under make and its tests the checkout is on PYTHONPATH, but the docs' commands that import attnref or study fail elsewhere" >&2
  fi
  if [ "$linked" != "$venv" ]; then
    if [ -n "$linked" ]; then
      if [ ! -d "$linked" ]; then why="it is gone"
      elif [ "${linked##*/}" != "venv-$hash" ]; then why="it was made from another requirements.txt"
      else why="it lacks the '$tier' tier"; fi
      echo "setup: re-pointing .venv from $linked ($(tiers_of "$linked")) to $venv ($(tiers_of "$venv")): $why"
    fi
    rm -f .venv && ln -s "$venv" .venv
  fi
  flock -u 9
fi
