#!/usr/bin/env bash
# Several "hosts" on one machine: each host is a network namespace with one
# veth into a bridge that lives in a namespace of its own. The library tells
# hosts apart by network namespace, so ranks of one namespace talk over shm
# and ranks of different namespaces over tcp, through the veths.
# One hccl-run per host starts that host's ranks (--world-size, --rank-offset)
# and all meet at h0's address (--comm-id).
# Usage (as root): netns_test.sh PATH/TO/hccl-run PATH/TO/mp_allreduce PATH/TO/mp_collectives
# Prints "SKIPPED: reason" and exits 0 where namespaces cannot be made.
set -u

RUN=${1:?usage: netns_test.sh HCCL_RUN MP_ALLREDUCE MP_COLLECTIVES}
ALLREDUCE=${2:?usage: netns_test.sh HCCL_RUN MP_ALLREDUCE MP_COLLECTIVES}
COLLECTIVES=${3:?usage: netns_test.sh HCCL_RUN MP_ALLREDUCE MP_COLLECTIVES}

PER_HOST=2                      # ranks per host
BUDGET_S=240                    # the whole script, well inside the ctest TIMEOUT of 300
LAUNCH_TIMEOUT_S=120            # hccl-run --timeout of each launcher
deadline=$((SECONDS + BUDGET_S))
next_port=29500
for f in "$RUN" "$ALLREDUCE" "$COLLECTIVES"; do
    [ -x "$f" ] || { echo "FAIL - $f is not an executable"; echo "0 passed, 1 failed"; exit 1; }
done
NETNS_HOSTS=3
# shellcheck source=netns_lib.sh
. "$(dirname "$0")/netns_lib.sh"

# host_of RANK: the host index whose launcher started it.
host_of() { echo $(($1 / PER_HOST)); }

# show_logs NAME NHOSTS: what each launcher said, for a failure.
show_logs() {
    local h
    for ((h = 0; h < $2; h++)); do
        tail -n 20 "$tmp/$1.h$h.out" | sed "s/^/    h$h stdout: /"
        tail -n 20 "$tmp/$1.h$h.err" | sed "s/^/    h$h stderr: /"
    done
}

# run_case NAME PROG NHOSTS SUCCESS_TEXT [VAR=VALUE...]: one launcher per
# host, all in the background, each inside its namespace and time-bounded.
# Passes when all exit 0 and every rank printed "rank R: SUCCESS_TEXT".
run_case() {
    local name=$1 prog=$2 nhosts=$3 want=$4
    shift 4
    local world=$((nhosts * PER_HOST)) port=$((next_port++))
    local left=$((deadline - SECONDS)) bound h r rc bad=""
    local -a rcs=()

    if [ "$left" -lt 30 ]; then
        fail "$name" "out of time: the script's budget of $BUDGET_S s is spent"
        return
    fi
    bound=$((left - 10 < LAUNCH_TIMEOUT_S + 10 ? left - 10 : LAUNCH_TIMEOUT_S + 10))
    pids=()
    for ((h = 0; h < nhosts; h++)); do
        env "$@" timeout -k 5 "$bound" ip netns exec "${NS_H[h]}" \
            "$RUN" -n "$PER_HOST" --world-size "$world" --rank-offset $((h * PER_HOST)) \
            --comm-id "$NET.1:$port" --timeout $((bound - 10)) --tag-output "$prog" \
            >"$tmp/$name.h$h.out" 2>"$tmp/$name.h$h.err" &
        pids+=($!)
    done
    for ((h = 0; h < nhosts; h++)); do
        wait "${pids[h]}"
        rcs+=($?)
    done
    pids=()
    for ((h = 0; h < nhosts; h++)); do
        rc=${rcs[h]}
        [ "$rc" -eq 0 ] || bad+="h$h exited $rc; "
    done
    for ((r = 0; r < world; r++)); do
        h=$(host_of "$r")
        grep -qxF "[$r]: rank $r: $want" "$tmp/$name.h$h.out" || bad+="rank $r did not print '$want'; "
    done
    if [ -z "$bad" ]; then
        ok "$name"
        return 0
    fi
    fail "$name" "${bad%; }"
    show_logs "$name" "$nhosts"
    return 1
}

# links_right NAME NHOSTS: in the INFO logs of case NAME, each rank reports
# an shm link to each rank of its host and a tcp connection (to an address
# on the veths) to each of the others, and no other link to any of them.
links_right() {
    local name=$1 nhosts=$2 world=$(($2 * PER_HOST)) r p log shm tcp bad=""
    for ((r = 0; r < world; r++)); do
        log="$tmp/$name.h$(host_of "$r").err"
        for ((p = 0; p < world; p++)); do
            [ "$p" -eq "$r" ] && continue
            shm="rank $r: shm link to rank $p "
            tcp="rank $r: tcp connection to rank $p "
            if [ "$(host_of "$p")" -eq "$(host_of "$r")" ]; then
                grep -qF "$shm" "$log" && ! grep -qF "$tcp" "$log" || bad+="$r-$p not shm; "
            else
                grep -qF "$tcp($NET." "$log" && ! grep -qF "$shm" "$log" ||
                    bad+="$r-$p not tcp over the veths; "
            fi
        done
    done
    if [ -z "$bad" ]; then
        ok "$name: shm within each host, tcp across hosts"
        return 0
    fi
    fail "$name: links" "${bad%; }"
    show_logs "$name" "$nhosts"
    return 1
}

for nhosts in 2 3; do
    run_case "allreduce_${nhosts}x$PER_HOST" "$ALLREDUCE" "$nhosts" "all checks passed"
    run_case "collectives_${nhosts}x$PER_HOST" "$COLLECTIVES" "$nhosts" "all collectives checked"
done
if run_case "links_3x$PER_HOST" "$COLLECTIVES" 3 "all collectives checked" \
    HCCL_DEBUG=INFO HCCL_DEBUG_SUBSYS=INIT,LINK; then
    links_right "links_3x$PER_HOST" 3
fi

# Tear down now (the trap then finds nothing left), so that what stays behind is counted.
cleanup
if ip netns list | grep -q "^$TAG-"; then
    fail "every namespace removed" "$(ip netns list | grep "^$TAG-" | tr '\n' ' ')"
else
    ok "every namespace removed"
fi

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
