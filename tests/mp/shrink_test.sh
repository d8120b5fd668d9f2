#!/usr/bin/env bash
# shrink_test.sh HCCL_RUN MP_SHRINK NRANKS SURVIVORS [mp_shrink args...]
# Runs mp_shrink (ranks killed on purpose, the others shrink past them) under
# hccl-run with a hard time bound; SURVIVORS ranks must report "survivor ok",
# and the launcher must name the ranks that were killed.
set -u
run=$1 prog=$2 n=$3 want=$4
shift 4
out=$(HCCL_RUN_GRACE_S=100 timeout 150 "$run" -n "$n" --timeout 120 --tag-output "$prog" "$@" 2>&1)
rc=$?
echo "$out"
if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
  echo "FAIL: the job hit its time bound"
  exit 1
fi
ok=$(grep -c "survivor ok" <<<"$out")
if [ "$ok" -ne "$want" ]; then
  echo "FAIL: $ok of $want survivors finished"
  exit 1
fi
if grep -qE "exited with status [1-9]|Sanitizer|runtime error" <<<"$out"; then
  echo "FAIL: a survivor did not exit cleanly"
  exit 1
fi
killed=$(grep -c "killed by signal 9" <<<"$out")
if [ "$killed" -ne $((n - want)) ]; then
  echo "FAIL: the launcher reported $killed ranks killed, not $((n - want))"
  exit 1
fi
echo "PASS: $ok survivors shrank past $killed dead ranks"
