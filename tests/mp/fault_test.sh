#!/usr/bin/env bash
# fault_test.sh HCCL_RUN MP_FAULT LINK [CASE...]
# The fault matrix over one link kind, 4 ranks: every HCCL_FAULT case of mp_fault.c (all when
# none is named). Each run is bounded; every survivor must fail with the expected result, then
# abort and build a new communicator without the victim. Prints, per survivor, the time from
# the fault to its error ("fault-to-error"); FAULT_REPEAT=N runs the matrix N times.
set -u
run=$1 prog=$2 link=$3
shift 3
n=4
dir=$(mktemp -d "${TMPDIR:-/tmp}/hccl-fault.XXXXXX")
trap 'rm -rf "$dir"' EXIT

# case | HCCL_FAULT | victim | expected survivor result(s) | extra environment
matrix="init|kill:rank=3,at=init|3|hcclRemoteError|HCCL_CONNECT_TIMEOUT=3
idle|kill:rank=1,at=idle,seq=1|1|hcclRemoteError|
mid|kill:rank=2,seq=2,step=3|2|hcclRemoteError|
destroy|kill:rank=1,at=destroy|1|hcclRemoteError|
close|close:rank=1,peer=2,seq=2|1|hcclRemoteError|
delay|delay:rank=2,ms=2500,seq=2|2|hcclTimeout|HCCL_EXEC_TIMEOUT=1
absent||3|hcclTimeout|HCCL_CONNECT_TIMEOUT=3"

fails=0
fail() { echo "FAIL [$link $1]: $2"; fails=$((fails + 1)); }

run_case() {
    local name=$1 fault=$2 victim=$3 want=$4 extra=$5 out rc t0 t1 tf
    rm -f "$dir/id"
    t0=$(date +%s.%N)
    # shellcheck disable=SC2086
    out=$(env HCCL_LINKS="$link" HCCL_CALIBRATE=0 HCCL_CONNECT_TIMEOUT=30 HCCL_RUN_GRACE_S=40 \
              HCCL_FAULT="$fault" $extra \
              timeout 60 "$run" -n $n --timeout 45 --tag-output "$prog" --case "$name" \
              --victim "$victim" --dir "$dir" 2>&1)
    rc=$?
    t1=$(date +%s.%N)
    echo "--- $link $name: HCCL_FAULT='$fault' $extra (launcher rc $rc, $(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.1f", b-a}') s)"
    grep -E "FAULTRESULT|HCCL_FAULT|FAIL|survivor ok|hccl-run" <<<"$out"
    case $fault in
    kill:*)
        [ "$rc" -ne 0 ] || fail "$name" "the launcher exited 0 although rank $victim was killed"
        grep -q "rank $victim .*killed by signal 9" <<<"$out" || fail "$name" "rank $victim was not killed"
        ;;
    *) [ "$rc" -eq 0 ] || fail "$name" "the launcher exited $rc" ;;
    esac
    tf=$(grep -oE "(HCCL_FAULT: |stays away ).*\(t=[0-9.]+ ms\)" <<<"$out" | head -1 | grep -oE "t=[0-9.]+" | cut -c3-)
    [ -n "$tf" ] || fail "$name" "no fault time in the output"
    local timeouts=0
    for r in $(seq 0 $((n - 1))); do
        local line res t
        [ "$r" -eq "$victim" ] && continue
        line=$(grep -E "^\[$r\]: .*FAULTRESULT" <<<"$out" | head -1)
        grep -qE "^\[$r\]: .*survivor ok" <<<"$out" || fail "$name" "rank $r did not start over"
        res=$(grep -oE "res=[a-zA-Z]+" <<<"$line" | cut -c5-)
        [[ " $want " == *" $res "* ]] || fail "$name" "rank $r got '$res', want $want"
        [ "$res" = hcclTimeout ] && timeouts=$((timeouts + 1))
        t=$(grep -oE "t_err=[0-9.]+" <<<"$line" | cut -c7-)
        [ -n "$t" ] && [ -n "$tf" ] &&
            awk -v l="$link" -v c="$name" -v r="$r" -v a="$tf" -v b="$t" \
                'BEGIN{printf "fault-to-error: link=%s case=%s rank=%s ms=%.1f\n", l, c, r, b-a}'
    done
    # Every rank reports the root cause: a timeout is hcclTimeout everywhere.
    [[ "$want" != *hcclTimeout* ]] || [ "$timeouts" -gt 0 ] || fail "$name" "no survivor timed out"
}

for ((rep = 0; rep < ${FAULT_REPEAT:-1}; rep++)); do
    while IFS='|' read -r name fault victim want extra; do
        [ $# -eq 0 ] || [[ " $* " == *" $name "* ]] || continue
        run_case "$name" "$fault" "$victim" "$want" "$extra"
    done <<<"$matrix"
done
[ "$fails" -eq 0 ] || { echo "FAIL: $fails check(s) failed"; exit 1; }
echo "PASS: fault matrix over $link"
