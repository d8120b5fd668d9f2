#!/usr/bin/env bash
# hccl-perf under the launcher: every collective checked in several dtypes and ops, the
# async/blocking and in-flight modes, the CSV/JSON outputs, and its refusal of bad flags.
set -euo pipefail
run=$1 perf=$2
fail() { echo "FAIL: $*" >&2; exit 1; }

"$run" -n 3 --timeout 120 "$perf" -C all -b 1 -e 40K -f 9 -n 2 -w 1 -d half -o avg -r 2 \
  || fail "all collectives, half avg, 3 ranks"
"$run" -n 2 --timeout 120 "$perf" -C all -b 64 -e 64K -f 32 -n 2 -w 1 -d int8 -o max -z 1 -N 3 \
  || fail "blocking, 3 in flight"
# Results stored past the cache: every plan with HCCL_STORE_MIN=1 (whatever the machine's
# cache; plans only), at sizes whose streamed bodies have heads and tails; 3 ranks send some
# receives on.
# And once at 48 MiB with the threshold from the cache (32 MiB here: 2 ranks stream from 16).
for args in "2 float sum" "3 double avg" "3 float max"; do
  read -r n dt op <<<"$args"
  log=$(HCCL_STORE_MIN=1 HCCL_LANE_MAX=0 HCCL_DEBUG=INFO "$run" -n "$n" --timeout 120 "$perf" -C all -b 1000 -e 3M \
        -f 47 -n 1 -w 1 -p both -d "$dt" -o "$op" 2>&1) || fail "stored past the cache ($args): $log"
  grep -q "store results past the cache" <<<"$log" || fail "HCCL_STORE_MIN=1 did not turn the stores on ($args)"
done
"$run" -n 2 --timeout 120 "$perf" -C all -s 48M -n 1 -w 1 -p both || fail "all collectives, 48 MiB, 2 ranks"

csv=$("$run" -n 4 --timeout 120 "$perf" -C reducescatter -b 1K -e 4K -f 2 -n 2 -o prod -d int64 --csv -p oop)
[[ $(head -1 <<<"$csv") == collective,size,count,type,redop,root,placement,time_us,algbw,busbw,wrong,nranks,algo ]] \
  || fail "CSV header: $(head -1 <<<"$csv")"
rows=$(tail -n +2 <<<"$csv" | awk -F, '$1 == "reducescatter" && $7 == "oop" && $11 == 0 && $12 == 4' | wc -l)
[[ $rows == 3 ]] || fail "want 3 checked oop rows, got: $csv"

json=$("$run" -n 2 --timeout 120 "$perf" -C alltoall -b 1K -e 1K -n 2 -a pairwise --json)
grep -q '"collective": "alltoall", "size": 1024, .*"wrong": 0, "nranks": 2, "algo": "pairwise"' <<<"$json" \
  || fail "JSON: $json"

sizes=$("$run" -n 2 --timeout 120 "$perf" -C broadcast -s 8,3K,64 -n 1 --csv | cut -d, -f2 | tail -n +2 | tr '\n' ' ')
[[ $sizes == "8 3072 64 " ]] || fail "-s 8,3K,64 gave sizes: $sizes"

for bad in "-C allgatherv" "-s 8,x" "-d float8" "-b 1M -e 1K" "-N 0" "-f 1" "-o xor"; do
  # shellcheck disable=SC2086 # the flags are meant to split
  if "$run" -n 2 --timeout 60 "$perf" $bad 2>/dev/null; then fail "accepted: $bad"; fi
done
echo "hccl-perf: ok"
