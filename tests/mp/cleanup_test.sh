#!/usr/bin/env bash
# cleanup_test.sh HCCL_RUN MP_DUMP
# A rank killed by SIGKILL inside init, once its shm segment exists and before every peer
# mapped it (the only window in which the segment has a name), leaves the segment behind;
# the next run that sets up shm removes it. A rank killed mid-run leaves nothing: its
# segment was unlinked as soon as the peers had it.
set -u
run=$1 prog=$2
fail() { echo "FAIL: $*"; exit 1; }
export HCCL_LINKS=shm HCCL_CALIBRATE=0 HCCL_RUN_GRACE_S=0
ns=$(printf %08x "$(stat -L -c %i /proc/self/ns/pid)")
segments_of() { ls /dev/shm 2>/dev/null | grep "^hccl-$ns$(printf %08x "$1")" ; }

out=$(timeout 60 "$run" -n 2 --timeout 30 --tag-output "$prog" init-crash 2>&1)
rc=$?
echo "$out"
[ "$rc" -ne 0 ] || fail "the init-crash run exited 0"
grep -q "rank 0 (pid [0-9]*) killed by signal 9" <<<"$out" || fail "rank 0 was not killed by SIGKILL"
pid=$(sed -n 's/^\[0\]: rank 0 pid \([0-9]*\)$/\1/p' <<<"$out")
[ -n "$pid" ] || fail "rank 0 did not say its pid"
left=$(segments_of "$pid")
echo "left by pid $pid: ${left:-nothing}"
[ -n "$left" ] || fail "no segment of pid $pid was left: the test did not kill inside the window"

out=$(timeout 60 "$run" -n 2 --timeout 30 --tag-output "$prog" ok 2>&1)
rc=$?
echo "$out"
[ "$rc" -eq 0 ] || fail "the next run failed ($rc)"
[ -z "$(segments_of "$pid")" ] || fail "the next run did not reclaim $left"
echo "reclaimed: $left"

out=$(timeout 60 "$run" -n 2 --timeout 30 --tag-output "$prog" mid-crash 2>&1)
rc=$?
echo "$out"
grep -q "rank 0 (pid [0-9]*) killed by signal 9" <<<"$out" || fail "rank 0 was not killed mid-run"
pid=$(sed -n 's/^\[0\]: rank 0 pid \([0-9]*\)$/\1/p' <<<"$out")
[ -n "$pid" ] || fail "rank 0 did not say its pid"
[ -z "$(segments_of "$pid")" ] || fail "a rank killed mid-run left $(segments_of "$pid")"
for p in $(sed -n 's/^\[[0-9]*\]: rank [0-9]* pid \([0-9]*\)$/\1/p' <<<"$out"); do
  [ -z "$(segments_of "$p")" ] || fail "pid $p left a segment after a mid-run crash"
done
echo "PASS: a segment left inside init is reclaimed by the next run; a mid-run crash leaves none"
