#!/usr/bin/env bash
# fault_matrix.sh [BUILD_DIR] [REPEAT]
# Per fault (a rank killed with nothing in flight, during the links' set-up or in a collective's
# step, a cut link, a rank late past the exec timeout, a mismatch with aborting ranks at either
# end, a rank that never arrives), at 2, 4, 8 and 16 ranks over shm, tcp and two hosts
# (hosts2: HCCL_HOST_ID splits the ranks in halves, shm within each, tcp between; choose with
# FAULT_MATRIX_LINKS and FAULT_MATRIX_NRANKS, and the faults with FAULT_MATRIX_CASES, names of
# cause_test.sh's cases): the share of reporting ranks whose code and root cause text are the
# fault's (and all the same), and the time from the fault to each rank's error. The fault's
# moment: the kill or the cut; for a timeout, its deadline (the first post of the
# collective + HCCL_EXEC_TIMEOUT), so the figure is the time past it (the late rank itself is
# left out: it hears of it when it arrives); for a mismatch, the last post of the collective (a
# rank that posts after the cause has settled fails at once). An absent rank is not timed: the
# connect deadline runs from the rendezvous' start. Runs tests/mp/cause_test.sh, REPEAT times
# per cell (default 3); raw lines and the table go to bench/results/ (FAULT_MATRIX_RAW=FILE
# summarizes an earlier run's raw lines again).
set -u
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-$here/../build}
repeat=${2:-3}
out_dir=$here/results
mkdir -p "$out_dir"
stamp=$(date +%Y%m%d-%H%M%S)
raw=${FAULT_MATRIX_RAW:-$out_dir/fault_matrix-$stamp.raw}
table=${raw%.raw}.txt

# FAULT_MATRIX_RAW=FILE: summarize an earlier run's raw lines instead of running again.
[ -n "${FAULT_MATRIX_RAW:-}" ] || : >"$raw"
for link in ${FAULT_MATRIX_LINKS:-shm tcp hosts2}; do
    [ -n "${FAULT_MATRIX_RAW:-}" ] && break
    for n in ${FAULT_MATRIX_NRANKS:-2 4 8 16}; do
        for ((i = 0; i < repeat; i++)); do
            # shellcheck disable=SC2086
            CAUSE_OUT=$raw bash "$here/../tests/mp/cause_test.sh" "$build/tools/hccl-run" \
                "$build/tests/mp/mp_cause" "$link" "$n" ${FAULT_MATRIX_CASES:-} >/dev/null 2>&1
            echo "run=$i end" | sed "s/^/link=$link n=$n /" >>"$raw"
        done
    done
done

# One run of a cell ends at its "end" line; its MARK lines give the fault's moment.
awk -v exec_ms=1000 '
function field(k,   i) { for (i = 1; i <= NF; i++) if (index($i, k "=") == 1) return substr($i, length(k) + 2); return "" }
function flush(   k, key, f, r, d) {
    for (k in ccase) {
        key = clink[k] " " cn[k] " " ccase[k]
        f = -1
        if (ccase[k] ~ /^kill/ || ccase[k] == "cut") f = kill_t[k]
        else if (ccase[k] == "late") f = post_min[k] + exec_ms
        else if (ccase[k] ~ /^mismatch/) f = post_max[k]
        cells[key] = 1
        for (r in rres) {
            split(r, a, SUBSEP); if (a[1] != k) continue
            want_n[key]++
            # The origin is the victim, except for a mismatch (the lower rank of the pair that saw it).
            origin = ccase[k] ~ /^mismatch/ ? "root cause at rank " : "root cause at rank " cvictim[k] ":"
            if (rres[r] == cwant[k] && rtext[r] == majority[k] && index(rtext[r], origin) == 1) ok_n[key]++
            # A late rank hears of its timeout when it arrives: not a time to the error.
            if (ccase[k] == "late" && a[2] == cvictim[k]) continue
            if (f > 0) { d = rt[r] - f; sum[key] += d; cnt[key]++; if (d > max[key]) max[key] = d }
        }
    }
    delete ccase; delete rres; delete rtext; delete rt; delete kill_t; delete post_min; delete post_max
    delete majority; delete votes; delete best; delete cvictim
}
/ end$/ { flush(); next }
{
    k = field("case")
    ccase[k] = k; clink[k] = field("link"); cn[k] = field("n"); cwant[k] = field("want"); cvictim[k] = field("victim")
    r = field("rank"); t = field("t")
    if ($0 ~ / MARK /) {
        w = field("what")
        if (w == "kill") kill_t[k] = t
        if (w == "post") { if (!(k in post_min) || t < post_min[k]) post_min[k] = t; if (t > post_max[k]) post_max[k] = t }
        next
    }
    rres[k, r] = field("res"); rt[k, r] = t
    text = $0; sub(/.* text=/, "", text); rtext[k, r] = text
    if (++votes[k, text] > best[k]) { best[k] = votes[k, text]; majority[k] = text }
}
END {
    printf "%-6s %-3s %-10s %-22s %-10s %-10s\n", "link", "n", "fault", "root cause reported", "mean ms", "max ms"
    for (key in cells) {
        split(key, a, " ")
        printf "%-6s %-3s %-10s %5d of %-5d (%3.0f%%)  %-10s %-10s\n", a[1], a[2], a[3], ok_n[key], want_n[key],
            want_n[key] ? 100 * ok_n[key] / want_n[key] : 0,
            cnt[key] ? sprintf("%.1f", sum[key] / cnt[key]) : "-", cnt[key] ? sprintf("%.1f", max[key]) : "-"
    }
}' "$raw" | { IFS= read -r head; echo "$head"; sort -k1,1 -k2,2n -k3,3; } | tee "$table"
echo "raw: $raw"
