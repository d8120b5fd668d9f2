#!/usr/bin/env bash
# A Broadcast root that runs ahead of its receiver (tests/mp/mp_runahead.c): for shm and tcp,
# 100000 Broadcasts of 1 KiB and 1000 of 60 KiB, the receiver starting LAG_MS late. Prints
# how many of them the root finished before the receiver began, and how much the receiver's
# RSS grew meanwhile and at its peak, against the flow-control cap (HCCL_BUFFSIZE, 4 MiB by
# default). Usage: bench/runahead.sh [BUILD_DIR] [LAG_MS]   (default build, 2000)
set -eu
cd "$(dirname "$0")/.."
build=${1:-build}
lag=${2:-2000}
run=$build/tools/hccl-run
prog=${RUNAHEAD_PROG:-$build/tests/mp/mp_runahead}
printf '%-5s %-22s %10s %14s %12s\n' link broadcasts "ahead" "held (KiB)" "peak (KiB)"
for link in shm tcp; do
    for spec in "100000 1024" "1000 61440"; do
        set -- $spec
        out=$(HCCL_LINKS=$link timeout 600 "$run" -n 2 "$prog" --count "$1" --bytes "$2" --lag-ms "$lag")
        ahead=$(sed -n 's/^root: .*, \([0-9]*\) of them done before.*/\1/p' <<<"$out")
        read -r base held peak < <(sed -n 's/^rank 1: .*after init \([0-9]*\) KiB, before the first call \([0-9]*\) KiB, peak \([0-9]*\) KiB/\1 \2 \3/p' <<<"$out")
        printf '%-5s %-22s %10s %14s %12s\n' "$link" "$1 x $2 B" "$ahead" "$((held - base))" "$((peak - base))"
    done
done
