#!/usr/bin/env bash
# Async + hcclWait against the blocking call (docs/performance.md): hccl-perf's -z 0 and
# -z 1 runs alternate ROUNDS times (with a second build, each round runs both builds), and
# for every size it prints the median time of each, the ratio of the medians and the median
# and range of the rounds' own ratios (a round's two runs share the machine's state, so the
# per-round ratio is the steadier figure where the machine is noisy).
# Usage: bench/async_ratio.sh [-n RANKS] [-l shm|tcp] [-s SIZES] [-T SECONDS] [-r ROUNDS]
#                             [-B BUILD] [-R REF_BUILD]
#   defaults: 2 ranks, shm, 16,1K,64K,1M, 0.2 s per size, 5 rounds, build/ and no reference.
# A reference build is any build tree of hccl (e.g. one compare.sh made with BENCH_REF).
set -eu
cd "$(dirname "$0")/.."
nranks=2 links=shm sizes=16,1K,64K,1M secs=0.2 rounds=5 build=build ref=
while getopts n:l:s:T:r:B:R: opt; do
    case $opt in
    n) nranks=$OPTARG ;;
    l) links=$OPTARG ;;
    s) sizes=$OPTARG ;;
    T) secs=$OPTARG ;;
    r) rounds=$OPTARG ;;
    B) build=$OPTARG ;;
    R) ref=$OPTARG ;;
    *) sed -n '2,10p' "$0" >&2; exit 2 ;;  # the usage above
    esac
done
builds=("$build")
[ -n "$ref" ] && builds+=("$ref")
for b in "${builds[@]}"; do
    [ -x "$b/tools/hccl-perf" ] || { echo "async_ratio: no $b/tools/hccl-perf (build it first)" >&2; exit 1; }
done
# One run, ROUND BUILD Z: "<round> <build> <z> <size> <time_us>" per size; a run that fails or
# prints no rows ends the script, since a missing round would shift the medians.
run_one() {
    local out
    out=$(HCCL_LINKS=$links timeout 600 "$2/tools/hccl-run" -n "$nranks" "$2/tools/hccl-perf" \
        -s "$sizes" -T "$secs" -w 2 -c 0 -p oop -z "$3" --csv) ||
        { echo "async_ratio: $2 -z $3 failed (exit $?)" >&2; exit 1; }
    out=$(awk -F, -v r="$1" -v b="$2" -v z="$3" '$1 == "allreduce" { print r, b, z, $2, $8 }' <<<"$out")
    [ -n "$out" ] || { echo "async_ratio: $2 -z $3 printed no results" >&2; exit 1; }
    echo "$out"
}
rows=$(for ((i = 0; i < rounds; i++)); do
    for b in "${builds[@]}"; do
        run_one "$i" "$b" 0
        run_one "$i" "$b" 1
    done
done)
echo "allreduce, $nranks ranks, $links, $rounds rounds of ${secs} s per size (time in us)"
awk '
# The sorted values of a space-separated list, in v[1..n]; returns n.
function sorted(list, v,   n, i, j, t) {
    n = split(list, v, " ")
    for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (v[j] < v[i]) { t = v[i]; v[i] = v[j]; v[j] = t }
    return n
}
function mid(v, n) { return n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2 }
function median(list,   v) { return mid(v, sorted(list, v)) }
{ t[$1, $2, $3, $4] = $5; if (!($2 in seenb)) { seenb[$2] = 1; border[++nb] = $2 }
  if (!($4 in seens)) { seens[$4] = 1; sorder[++ns] = $4 }; if ($1 + 1 > nr) nr = $1 + 1 }
END {
    printf "%-24s %9s %10s %10s %6s  %s\n", "build", "bytes", "async", "blocking", "ratio", "rounds: median (range)"
    for (bi = 1; bi <= nb; bi++) for (si = 1; si <= ns; si++) {
        b = border[bi]; s = sorder[si]; la = lb = lr = ""
        for (i = 0; i < nr; i++) {
            a = t[i, b, 0, s]; z = t[i, b, 1, s]
            la = la " " a; lb = lb " " z; if (z > 0) lr = lr " " a / z
        }
        ma = median(la); mb = median(lb); nrr = sorted(lr, v)
        printf "%-24s %9s %10.3f %10.3f %6.2f  %.2f (%.2f-%.2f)\n", b, s, ma, mb, ma / mb, mid(v, nrr), v[1], v[nrr]
    }
}' <<<"$rows"
