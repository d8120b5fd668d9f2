#!/usr/bin/env bash
# dump_test.sh HCCL_RUN MP_DUMP NRANKS
# A job that hangs on purpose: after a first AllReduce, every rank but the last posts a
# second one (seq 1) while the last waits for a receive from rank 0 that never comes.
# hccl-run's --timeout must first collect every rank's state report (SIGUSR1, tagged lines
# through the ranks' stderr), then end with its timeout error, exit 124, within a bound.
set -u
run=$1 prog=$2 n=$3
last=$((n - 1))
limit=6
fail() { echo "FAIL: $*"; exit 1; }

start=$(date +%s%N)
out=$(HCCL_CALIBRATE=0 timeout 60 "$run" -n "$n" --timeout "$limit" --tag-output "$prog" hang 2>&1)
rc=$?
elapsed_ms=$((($(date +%s%N) - start) / 1000000))
echo "$out"
echo "exit $rc after $elapsed_ms ms"

[ "$rc" -eq 124 ] || fail "hccl-run exited $rc, not 124 (timeout)"
! grep -q "HCCL_DUMP_ON_SIGNAL.*\(ignored\|not supported\)" <<<"$out" ||
  fail "the library does not know HCCL_DUMP_ON_SIGNAL"
posted=$(grep -c "posted its last call" <<<"$out")
[ "$posted" -eq "$n" ] || fail "only $posted of $n ranks posted their last call before the timeout"
grep -q "hccl-run: timeout after $limit s; asking ranks .* for their state (SIGUSR1)" <<<"$out" ||
  fail "hccl-run did not ask the ranks for their state"
for ((r = 0; r < n; r++)); do
  mine=$(grep "^\[$r\]: " <<<"$out")
  grep -q "state dump on SIGUSR1" <<<"$mine" || fail "no report from rank $r"
  grep -q "state dump: end of report (1 communicator)" <<<"$mine" || fail "rank $r's report did not end"
  grep -q "hccl state: comm [0-9a-f]* rank $r of $n, 1 request outstanding" <<<"$mine" ||
    fail "rank $r's report does not show its request outstanding"
  if [ "$r" -eq "$last" ]; then
    grep -q "request recv #0 from rank 0 (4096 x float32)" <<<"$mine" ||
      fail "rank $r's report does not name its receive"
    grep -q "recv from rank 0 tag [0-9]* bytes recv\[0, 16384): posted, waiting on rank 0" <<<"$mine" ||
      fail "rank $r's report does not show its receive waiting on rank 0"
  elif grep -q "shm lane" <<<"$mine"; then
    # A one-host communicator's 16 KiB AllReduce may take the lane (HCCL_LANE_MAX).
    grep -q "request allreduce seq 1 (4096 x float32, sum): shm lane, waiting on ranks 2$" <<<"$mine" ||
      fail "rank $r's report does not show AllReduce seq 1 waiting on rank 2 on the lane"
  else
    grep -q "request allreduce seq 1 (4096 x float32, sum): algorithm [a-z0-9_]*, [0-9]* of [0-9]* steps not done" <<<"$mine" ||
      fail "rank $r's report does not show AllReduce seq 1 and its algorithm"
    grep -Eq "step [0-9]+ (send to|recv from) rank [0-9]+ tag [0-9]+ bytes [a-z]+\[[0-9]+, [0-9]+\): posted, waiting on rank [0-9]+" <<<"$mine" ||
      fail "rank $r's report has no step posted and waiting on a peer"
  fi
  grep -q "link to rank [0-9]* (${HCCL_LINKS:-shm}): last send" <<<"$mine" ||
    fail "rank $r's report has no link activity"
done
# The reports come before the verdict, and the verdict is the last word.
last_line=$(grep "^hccl-run:" <<<"$out" | tail -1)
grep -q "hccl-run: timeout after $limit s; ranks still running: " <<<"$last_line" ||
  fail "the last launcher line is not the timeout error: $last_line"
report_at=$(grep -n "state dump: end of report" <<<"$out" | tail -1 | cut -d: -f1)
verdict_at=$(grep -n "ranks still running" <<<"$out" | tail -1 | cut -d: -f1)
[ "$report_at" -lt "$verdict_at" ] || fail "a report came after the timeout error"
# The timeout, up to 2 s of reports, and up to 2 s more for SIGTERM: 15 s is plenty.
[ "$elapsed_ms" -lt 15000 ] || fail "took $elapsed_ms ms"
echo "PASS: every rank's report before the timeout error, in $elapsed_ms ms"
