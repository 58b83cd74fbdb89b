#!/usr/bin/env bash
# mpirun for this machine's tests and for users: the same arguments as mpirun, plus what a
# container or a small CI machine needs:
#   - running as root (containers) needs Open MPI's --allow-run-as-root;
#   - more ranks than cores (2-rank tests on a 1- or 2-core CI machine) needs --oversubscribe,
#     and ranks that yield the core while they wait (mpi_yield_when_idle) instead of
#     spinning against each other.
# Exits 127 with a message when mpirun is missing (apt-get install openmpi-bin libopenmpi-dev).
set -euo pipefail
if ! command -v mpirun >/dev/null 2>&1; then
  echo "mpirun.sh: mpirun not found (apt-get install openmpi-bin libopenmpi-dev)" >&2
  exit 127
fi
extra=()
if mpirun --version 2>/dev/null | grep -q "Open MPI"; then
  [ "$(id -u)" = 0 ] && extra+=(--allow-run-as-root)
  extra+=(--oversubscribe --mca mpi_yield_when_idle 1)
fi
exec mpirun "${extra[@]}" "$@"
