#!/usr/bin/env bash
# kill_test.sh HCCL_RUN MP_ALLREDUCE NRANKS VICTIM [--kill-rank|--kill-small]
# The victim dies by SIGKILL inside a 64 MiB AllReduce (--kill-small: between
# small blocking ones, which take the shm lane); every survivor must report
# hcclRemoteError (and abort cleanly) well within the launcher's grace.
set -u
run=$1 prog=$2 n=$3 victim=$4 mode=${5:---kill-rank}
out=$(HCCL_RUN_GRACE_S=20 timeout 90 "$run" -n "$n" --timeout 60 --tag-output "$prog" "$mode" "$victim" 2>&1)
rc=$?
echo "$out"
ok=$(grep -c "survivor ok" <<<"$out")
if [ "$rc" -eq 0 ]; then
  echo "FAIL: the launcher exited 0 although rank $victim was killed"
  exit 1
fi
grep -q "rank $victim .*killed by signal 9" <<<"$out" || { echo "FAIL: the launcher did not name rank $victim"; exit 1; }
if [ "$ok" -ne $((n - 1)) ]; then
  echo "FAIL: $ok of $((n - 1)) survivors reported hcclRemoteError and aborted cleanly"
  exit 1
fi
# Detection must be quick: every survivor's reported time under 10 s.
slow=$(grep -oE "hcclRemoteError|remote error[^:]* after [0-9.]+ s" <<<"$out" | grep -oE "[0-9.]+ s" | awk '$1 > 10' | wc -l)
[ "$slow" -eq 0 ] || { echo "FAIL: a survivor took more than 10 s"; exit 1; }
echo "PASS: $ok survivors failed with hcclRemoteError"
