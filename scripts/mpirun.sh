#!/usr/bin/env bash
# mpirun for this machine's tests and for users: the same arguments as mpirun, plus what a
# container or a small CI machine needs:
#   - running as root (containers) needs Open MPI's --allow-run-as-root;
#   - more ranks than cores (2-rank tests on a 1- or 2-core CI machine) needs --oversubscribe,
#     and ranks that yield the core while they wait (mpi_yield_when_idle) instead of
#     spinning against each other.
# and a stop that saves (doc/multi-gpu.md "Stopping on a cluster"): Open MPI's mpirun passes a
# SIGTERM, SIGINT or SIGHUP on to the ranks and kills them 1 s later, before a step of seconds and
# its save end. So mpirun runs in a process group of its own (Ctrl-C and `kill -- -PGID` reach
# this script alone), and a stop signal this script gets goes to mpirun as SIGUSR1, which mpirun
# passes on to every rank without killing any: each trainer saves after its step, exits, and
# mpirun with it. A second stop signal goes to mpirun as SIGTERM: stop at once, without saving.
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
else
  exec mpirun "$@"  # (another MPI: its own signal handling)
fi
set -m  # background jobs in process groups of their own
# (stdin from /dev/null: a process group that is not the terminal's must not read it; the
# trainers read no input)
mpirun "${extra[@]}" "$@" </dev/null &
pid=$!
set +m
stops=0
first=""
stop() {
  stops=$((stops + 1))
  if [ "$stops" = 1 ]; then
    first=$1
    echo "mpirun.sh: SIG$1: asking every rank to save and stop (SIGUSR1 to mpirun; again: stop at once)" >&2
    kill -USR1 "$pid" 2>/dev/null || true
  else
    echo "mpirun.sh: SIG$1 again: stopping at once (SIGTERM to mpirun)" >&2
    kill -TERM "$pid" 2>/dev/null || true
  fi
}
for sig in INT TERM HUP USR1; do
  trap "stop $sig" "$sig"
done
# (wait returns early, > 128, when a trapped signal comes: wait again until mpirun has exited)
status=0
while :; do
  wait "$pid" && status=0 || status=$?
  kill -0 "$pid" 2>/dev/null || break
done
# (the ranks ended by the SIGUSR1 sent for a stop: the status of the signal this script got)
if [ -n "$first" ] && [ "$status" = $((128 + $(kill -l USR1))) ]; then
  status=$((128 + $(kill -l "$first")))
fi
exit "$status"
