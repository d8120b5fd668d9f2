#!/usr/bin/env bash
# cause_test.sh HCCL_RUN MP_CAUSE LINK NRANKS [CASE...]
# LINK: shm, tcp, or hosts2 (two hosts by HCCL_HOST_ID: shm within each half, tcp between).
# Every rank that reports a fault (mp_cause.c) must report the same code and the same root
# cause text, naming the rank where it started: a killed rank, a rank late past the exec
# timeout, a mismatch whose ranks abort at once (either end calling the odd collective), a
# rank that never arrives. Each run is
# bounded; CAUSE_OUT=FILE appends every rank's line (bench/fault_matrix.sh reads it).
set -u
run=$1 prog=$2 link=$3 n=$4
shift 4
last=$((n - 1))

# case | victim | expected code | extra environment | the victim reports too | text must contain
# (mismatch0: rank 0 calls Broadcast, the others AllReduce; mismatch: the last rank does;
# kill: before the second AllReduce, with nothing in flight; kill_init: between the rendezvous
# and the links' set-up; kill_mid: at the second step of an AllReduce; cut: the victim closes
# its link to rank 0 as a cut cable would, and stays; kill_lane and cut_lane: the same as the
# victim publishes the second AllReduce on the shm lane, which HCCL_LANE_MAX lets the 16 KiB
# calls take where every rank shares one host)
matrix="kill|$last|hcclRemoteError||no|rank $last went away
late|$last|hcclTimeout|HCCL_EXEC_TIMEOUT=1|yes|rank $last did not take part in allreduce seq 1
mismatch0|0|hcclInvalidUsage|HCCL_CHECK=1|yes|collective mismatch at seq 1
mismatch|$last|hcclInvalidUsage|HCCL_CHECK=1|yes|collective mismatch at seq 1
absent|$last|hcclTimeout|HCCL_CONNECT_TIMEOUT=3|no|$last
kill_init|$last|hcclRemoteError|HCCL_FAULT=kill:rank=$last,at=init|no|rank $last went away
kill_mid|$last|hcclRemoteError|HCCL_FAULT=kill:rank=$last,seq=1,step=1|no|rank $last went away
cut|$last|hcclRemoteError|HCCL_FAULT=close:rank=$last,peer=0,seq=1|yes|rank $last went away
kill_lane|$last|hcclRemoteError|HCCL_LANE_MAX=65536 HCCL_FAULT=kill:rank=$last,seq=1,step=0|no|rank $last went away
cut_lane|$last|hcclRemoteError|HCCL_LANE_MAX=65536 HCCL_FAULT=close:rank=$last,peer=0,seq=1|yes|rank $last went away"

links=$link wrap=()
if [ "$link" = hosts2 ]; then
    links=""
    # shellcheck disable=SC2016
    wrap=(sh -c 'HCCL_HOST_ID=host$((RANK * 2 / $HCCL_CAUSE_N)) exec "$0" "$@"')
    export HCCL_CAUSE_N=$n
fi

fails=0
fail() { echo "FAIL [$link n=$n $1]: $2"; fails=$((fails + 1)); }

run_case() {
    local name=$1 victim=$2 want=$3 extra=$4 victim_reports=$5 needle=$6 out first="" count=0 pcase
    # kill_* and cut: HCCL_FAULT does the harm while every rank runs the same calls.
    case $name in kill_* | cut | cut_*) pcase=fault ;; *) pcase=${name%0} ;; esac
    # shellcheck disable=SC2086
    out=$(env ${links:+HCCL_LINKS="$links"} HCCL_CALIBRATE=0 HCCL_CONNECT_TIMEOUT=30 HCCL_RUN_GRACE_S=20 $extra \
              timeout 90 "$run" -n "$n" --timeout 60 "${wrap[@]}" "$prog" --case "$pcase" --victim "$victim" 2>&1)
    echo "--- $link n=$n $name (launcher rc $?)"
    # HCCL_FAULT logs its moment (t=: CLOCK_MONOTONIC ms, as mp_cause's MARK lines).
    out+=$'\n'$(grep -oE "HCCL_FAULT: rank [0-9]+ (kills itself|closes its).*\(t=[0-9.]+ ms\)" <<<"$out" |
                 sed -E 's/HCCL_FAULT: rank ([0-9]+) .*\(t=([0-9.]+) ms\)/MARK rank=\1 what=kill t=\2/')
    grep -E "^(CAUSE|FULL) " <<<"$out"
    [ -n "${CAUSE_OUT:-}" ] && grep -E "^(CAUSE|MARK) " <<<"$out" |
        sed "s/^/link=$link n=$n case=$name victim=$victim want=$want /" >>"$CAUSE_OUT"
    for r in $(seq 0 $((n - 1))); do
        local line res text
        [ "$r" -eq "$victim" ] && [ "$victim_reports" = no ] && continue
        line=$(grep -E "^CAUSE rank=$r " <<<"$out" | head -1)
        [ -n "$line" ] || { fail "$name" "rank $r reported nothing"; continue; }
        res=$(grep -oE "res=[a-zA-Z]+" <<<"$line" | cut -c5-)
        text=${line#* text=}
        [ "$res" = "$want" ] || fail "$name" "rank $r got $res, want $want"
        [[ "$line" != *" async="* || "$line" == *" async=hcclSuccess "* || "$line" == *" async=$want "* ]] ||
            fail "$name" "rank $r: hcclCommGetAsyncError differs from $want: $line"
        [[ "$text" == *"$needle"* ]] || fail "$name" "rank $r: the text does not say '$needle': $text"
        if [ -z "$first" ]; then
            first=$text
        elif [ "$text" != "$first" ]; then
            fail "$name" "rank $r tells another story: '$text' vs '$first'"
        fi
        count=$((count + 1))
    done
    [ "$count" -gt 0 ] || fail "$name" "no rank reported"
}

while IFS='|' read -r name victim want extra victim_reports needle; do
    [ $# -eq 0 ] || [[ " $* " == *" $name "* ]] || continue
    run_case "$name" "$victim" "$want" "$extra" "$victim_reports" "$needle"
done <<<"$matrix"
[ "$fails" -eq 0 ] || { echo "FAIL: $fails check(s) failed"; exit 1; }
echo "PASS: every rank reports the root cause ($link, $n ranks)"
