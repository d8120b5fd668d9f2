#!/usr/bin/env bash
# hcclCommShrink's time after a rank died: one rank of N is killed, the survivors detect it and
# shrink past it (tests/mp/mp_shrink.c); the time is the slowest survivor's, from its call to
# its return with the new communicator up. Median of REPS jobs per link and rank count.
# Usage: bench/shrink.sh [REPS] [BUILD_DIR]   (default 7, build)
# Writes bench/results/shrink-<date>.csv (link,ranks,rep,ms) and prints the medians.
set -u
cd "$(dirname "$0")/.."
reps=${1:-7}
build=${2:-build}
RUN=$build/tools/hccl-run
PROG=$build/tests/mp/mp_shrink
if [ ! -x "$RUN" ] || [ ! -x "$PROG" ]; then
    cmake --build "$build" --target hccl-run mp_shrink -j2 >/dev/null || exit 1
fi
mkdir -p bench/results
csv=bench/results/shrink-$(date -u +%Y%m%d-%H%M%S).csv
echo "link,ranks,rep,ms" >"$csv"
printf '%-5s %6s %10s %10s %10s\n' link ranks median_ms min_ms max_ms
for link in shm tcp; do
    for n in 4 8; do
        times=()
        for rep in $(seq "$reps"); do
            out=$(HCCL_LINKS=$link HCCL_RUN_GRACE_S=60 timeout 100 "$RUN" -n "$n" --timeout 80 \
                  "$PROG" --kill $((n - 1)) 2>&1)
            ms=$(grep -oE 'shrink: [0-9]+ -> [0-9]+ ranks in [0-9.]+ ms' <<<"$out" | grep -oE '[0-9.]+ ms' |
                 grep -oE '[0-9.]+')
            if [ -z "$ms" ]; then
                echo "shrink.sh: $link, $n ranks, run $rep failed:" >&2
                echo "$out" | tail -20 >&2
                exit 1
            fi
            echo "$link,$n,$rep,$ms" >>"$csv"
            times+=("$ms")
        done
        printf '%s\n' "${times[@]}" | sort -g | awk -v l="$link" -v n="$n" '
            { v[NR] = $1 } END { m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2;
                                 printf "%-5s %6d %10.1f %10.1f %10.1f\n", l, n, m, v[1], v[NR] }'
    done
done
echo "(every run: $csv)"
