#!/usr/bin/env bash
# A host whose /dev/shm is smaller than its ranks' shm segments may come to use: the rings
# are then left sparse, so nothing fails at set-up, and a rank that later touches a page
# /dev/shm cannot supply dies of SIGBUS. The lowest rank of the host says so at set-up (naming
# the sizes); small collectives still run. With room enough, nothing is said and the rings'
# pages are populated at set-up. (2 ranks with a CPU each may use about 4 MiB: two ring windows
# of 2 MiB, and lane slots only as far as 32 KiB; where they share one, two 4 MiB rings.)
# Usage (as root): shm_room_test.sh PATH/TO/hccl-run PATH/TO/hccl-perf
# Prints "SKIPPED: reason" and exits 0 where a private /dev/shm cannot be mounted.
set -u

RUN=${1:?usage: shm_room_test.sh HCCL_RUN HCCL_PERF}
PERF=${2:?usage: shm_room_test.sh HCCL_RUN HCCL_PERF}
pass=0 fail=0

if [ "$(id -u)" != 0 ] || ! command -v unshare >/dev/null ||
    ! unshare -m true 2>/dev/null; then
    echo "SKIPPED: needs root and unshare -m for a private /dev/shm"
    exit 0
fi

# run_with SIZE: 2 ranks of small AllReduces with a tmpfs of SIZE on /dev/shm; stderr to $err.
err=$(mktemp)
trap 'rm -f "$err"' EXIT
run_with() {
    HCCL_DEBUG=INFO HCCL_DEBUG_SUBSYS=LINK \
        unshare -m bash -c "mount -t tmpfs -o size=$1 tmpfs /dev/shm &&
        '$RUN' -n 2 --timeout 60 '$PERF' -C allreduce -b 8 -e 1K -f 4 -n 3 -w 1" >/dev/null 2>"$err"
}
check() { # NAME CONDITION...
    local name=$1
    shift
    if "$@"; then
        echo "ok - $name"
        pass=$((pass + 1))
    else
        echo "FAIL - $name"
        sed 's/^/    stderr: /' "$err" | tail -n 10
        fail=$((fail + 1))
    fi
}

run_with 3m
rc=$?
check "3 MiB /dev/shm: the small collectives run" test "$rc" = 0
check "3 MiB /dev/shm: the warning names the room and the need" \
    grep -q "shm: /dev/shm has [0-9]* MiB free, but the 2 ranks of this host may come to use up to [0-9]* MiB" "$err"
check "3 MiB /dev/shm: said once, by the host's lowest rank" test "$(grep -c 'SIGBUS' "$err")" = 1
check "3 MiB /dev/shm: the rings left sparse on both ranks" \
    test "$(grep -c 'shm: rings left sparse: /dev/shm had' "$err")" = 2

run_with 1g
rc=$?
check "1 GiB /dev/shm: the collectives run" test "$rc" = 0
check "1 GiB /dev/shm: nothing said" bash -c "! grep -q 'SIGBUS' '$err'"
check "1 GiB /dev/shm: both ranks' rings populated at set-up" \
    test "$(grep -c 'shm: 2 rings of [0-9]* KiB populated' "$err")" = 2

echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
