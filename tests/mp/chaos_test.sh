#!/usr/bin/env bash
# Chaos on two "hosts" (network namespaces joined by veth, two ranks each: shm inside a host,
# tcp between): while the ranks run AllReduces (tests/mp/mp_chaos.c), the script cuts h1's link,
# kills a rank, or slows h1's link with tc, and checks that every run ends within its bound
# with the right error on every surviving rank, then that a clean run right after succeeds.
# Prints the time from each fault to each survivor's error.
# Usage (as root): chaos_test.sh PATH/TO/hccl-run PATH/TO/mp_chaos
# Prints "SKIPPED: reason" and exits 0 where namespaces cannot be made.
set -u

RUN=${1:?usage: chaos_test.sh HCCL_RUN MP_CHAOS}
CHAOS=${2:?usage: chaos_test.sh HCCL_RUN MP_CHAOS}
PER_HOST=2
WORLD=4
CASE_TIMEOUT_S=60               # each launcher's --timeout; the verdicts below are much tighter
for f in "$RUN" "$CHAOS"; do
    [ -x "$f" ] || { echo "FAIL - $f is not an executable"; echo "0 passed, 1 failed"; exit 1; }
done
NETNS_HOSTS=2
# shellcheck source=netns_lib.sh
. "$(dirname "$0")/netns_lib.sh"
command -v tc >/dev/null 2>&1 || skip "tc is not installed"
next_port=29600
fifo=$tmp/ready
mkfifo "$fifo" || { fail "mkfifo"; exit 1; }
exec 3<>"$fifo" # held open both ways: the ranks' open never blocks, and read -t bounds our wait

show_logs() {
    local h
    for ((h = 0; h < NETNS_HOSTS; h++)); do
        tail -n 20 "$tmp/$1.h$h.out" | sed "s/^/    h$h stdout: /"
        tail -n 20 "$tmp/$1.h$h.err" | sed "s/^/    h$h stderr: /"
    done
}

# Puts the network back as it was and waits for carrier.
restore_net() {
    ip -n "${NS_H[1]}" link set "$IFNAME" up 2>/dev/null
    tc -n "${NS_H[1]}" qdisc del dev "$IFNAME" root 2>/dev/null
    wait_links_up
}

# chaos NAME FAULT EXPECT [ARGS...] [-- VAR=VALUE...]: starts both hosts' ranks running mp_chaos
# ARGS, waits until every rank has done its warm-up, strikes with FAULT (kill RANK | cut |
# slow RATE | none), and waits for the launchers. Then every rank other than a killed one must
# print EXPECT ("completed" or "error RESULT[|RESULT]") within BOUND_S seconds of the strike.
chaos() {
    local name=$1 fault=$2 expect=$3 bound=$4
    shift 4
    local -a args=() envs=()
    while [ $# -gt 0 ] && [ "$1" != "--" ]; do args+=("$1"); shift; done
    [ $# -gt 0 ] && shift
    envs=("$@")
    local port=$((next_port++)) h r line victim=-1 struck bad="" times=""
    local -A pid_of=()

    pids=()
    for ((h = 0; h < NETNS_HOSTS; h++)); do
        env HCCL_RUN_GRACE_S=20 "${envs[@]}" timeout -k 5 $((CASE_TIMEOUT_S + 10)) \
            ip netns exec "${NS_H[h]}" "$RUN" -n "$PER_HOST" --world-size "$WORLD" \
            --rank-offset $((h * PER_HOST)) --comm-id "$NET.1:$port" --timeout "$CASE_TIMEOUT_S" \
            --tag-output "$CHAOS" --ready "$fifo" "${args[@]}" \
            >"$tmp/$name.h$h.out" 2>"$tmp/$name.h$h.err" &
        pids+=($!)
    done
    for ((r = 0; r < WORLD; r++)); do
        if ! read -r -t 60 -u 3 line; then
            bad+="only $r of $WORLD ranks became ready; "
            break
        fi
        pid_of[${line%% *}]=${line##* }
    done
    struck=$(date +%s.%N)
    if [ -z "$bad" ]; then
        case $fault in
        kill\ *) victim=${fault#kill }; kill -KILL "${pid_of[$victim]}" ;;
        cut) ip -n "${NS_H[1]}" link set "$IFNAME" down ;;
        slow\ *) tc -n "${NS_H[1]}" qdisc add dev "$IFNAME" root tbf rate "${fault#slow }" \
                     burst 32kbit latency 400ms ;;
        none) ;;
        esac
    fi
    for ((h = 0; h < NETNS_HOSTS; h++)); do wait "${pids[h]}"; done
    pids=()
    restore_net || bad+="the network did not come back; "

    for ((r = 0; r < WORLD; r++)); do
        local out="$tmp/$name.h$((r / PER_HOST)).out" got
        if [ "$r" -eq "$victim" ]; then
            grep -q "rank $r .*killed by signal 9" "$tmp/$name.h$((r / PER_HOST)).err" ||
                bad+="the launcher did not name rank $r as killed; "
            continue
        fi
        got=$(grep -m1 "^\[$r\]: rank $r: \(completed\|error\)" "$out")
        if ! grep -Eq "^\[$r\]: rank $r: ($expect)" <<<"$got"; then
            bad+="rank $r: '${got:-nothing}' instead of '$expect'; "
            continue
        fi
        if [[ $got == *" error "* ]]; then
            local at=${got#* at } dt
            at=${at%%:*}
            dt=$(awk -v a="$at" -v s="$struck" 'BEGIN { printf "%.2f", a - s }')
            times+=" $r:${dt}s"
            awk -v d="$dt" -v b="$bound" 'BEGIN { exit !(d <= b) }' ||
                bad+="rank $r took ${dt} s (bound $bound s); "
            grep -q "^\[$r\]: rank $r: aborted cleanly" "$out" || bad+="rank $r did not abort cleanly; "
        fi
    done
    if [ -z "$bad" ]; then
        ok "$name${times:+: fault to error on each survivor$times}"
        return 0
    fi
    fail "$name" "${bad%; }"
    show_logs "$name"
    return 1
}

chaos kill_mid_run "kill 3" "error hcclRemoteError" 10
chaos kill_leader "kill 2" "error hcclRemoteError" 10
chaos cut_link cut "error (hcclTimeout|hcclRemoteError) " 10 --expect hcclTimeout,hcclRemoteError \
    -- HCCL_EXEC_TIMEOUT=3
chaos slow_link_completes "slow 50mbit" "completed 3" 60 --bytes 1048576 --iters 3
chaos slow_link_times_out "slow 1mbit" "error (hcclTimeout|hcclRemoteError) " 10 \
    --expect hcclTimeout,hcclRemoteError -- HCCL_EXEC_TIMEOUT=2
chaos clean_run_after none "completed 5" 60 --iters 5

cleanup
if ip netns list | grep -q "^$TAG-"; then
    fail "every namespace removed" "$(ip netns list | grep "^$TAG-" | tr '\n' ' ')"
else
    ok "every namespace removed"
fi
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
