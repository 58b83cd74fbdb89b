#!/usr/bin/env bash
# Runs test binaries from one build directory and prints a table; exits 1 if any failed.
# Usage: scripts/run_tests.sh BUILD_DIR NAME... (run from the repository root)
# Each binary's output goes to BUILD_DIR/logs/NAME.log; a failing one is also printed.
# TEST_WRAPPER (e.g. "compute-sanitizer --error-exitcode 1") is put before each command.
set -uo pipefail
dir=$1; shift
mkdir -p "$dir/logs"
failed=()
printf '%-34s %-6s %8s\n' "test ($dir)" status seconds
for name in "$@"; do
  log="$dir/logs/$name.log"
  start=$(date +%s.%N)
  ${TEST_WRAPPER:-} timeout "${TEST_TIMEOUT:-600}" "$dir/$name" >"$log" 2>&1
  rc=$?
  secs=$(echo "$(date +%s.%N) - $start" | bc)
  if [ $rc -eq 0 ]; then status=ok; else status=FAIL; failed+=("$name"); fi
  printf '%-34s %-6s %8.2f\n' "$name" "$status" "$secs"
  if [ $rc -ne 0 ]; then
    echo "----- $log (exit $rc, last 40 lines) -----"
    tail -n 40 "$log"
    echo "-----"
  fi
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "FAILED in $dir: ${failed[*]}"
  exit 1
fi
