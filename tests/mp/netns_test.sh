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
TAG=hccl$$                      # every namespace we make starts with this
NS_BR=$TAG-br                   # holds the bridge
NS_H=("$TAG-h0" "$TAG-h1" "$TAG-h2")
IFNAME=hccl0                    # each host's veth, inside its namespace
NET=10.99.$(($$ % 250 + 1))     # hosts are $NET.1, $NET.2, ...: private to the namespaces
deadline=$((SECONDS + BUDGET_S))
next_port=29500
passed=0
failed=0
created=()                      # namespaces made so far, deleted on any exit
pids=()                         # launchers (their timeout(1)) running now

skip() {
    echo "SKIPPED: $*"
    exit 0
}

command -v ip >/dev/null 2>&1 || skip "iproute2 is not installed (no 'ip' command)"
for f in "$RUN" "$ALLREDUCE" "$COLLECTIVES"; do
    [ -x "$f" ] || { echo "FAIL - $f is not an executable"; echo "0 passed, 1 failed"; exit 1; }
done
tmp=$(mktemp -d "${TMPDIR:-/tmp}/hccl-netns-test.XXXXXX") || exit 1

# Launchers first (timeout(1) passes the TERM on and SIGKILLs 5 s later), so
# no process still sits in a namespace when it goes; the veths and the bridge
# live inside the namespaces and go with them.
cleanup() {
    local pid i
    for pid in "${pids[@]}"; do
        kill -TERM "$pid" 2>/dev/null
    done
    for pid in "${pids[@]}"; do
        wait "$pid" 2>/dev/null
    done
    pids=()
    for ((i = ${#created[@]} - 1; i >= 0; i--)); do
        ip netns del "${created[i]}" 2>/dev/null ||
            echo "warning: could not delete network namespace ${created[i]}" >&2
    done
    created=()
    rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 129' HUP
trap 'exit 130' INT
trap 'exit 143' TERM

ok() {
    passed=$((passed + 1))
    echo "ok   - $1"
}

fail() {
    failed=$((failed + 1))
    echo "FAIL - $1${2:+ ($2)}"
}

# The probe: no permission or no namespace support means skip, not fail.
if ! ip netns add "$NS_BR" 2>"$tmp/netns.err"; then
    skip "cannot create a network namespace: $(tr '\n' ' ' <"$tmp/netns.err")"
fi
created+=("$NS_BR")

# Bridge in $NS_BR; per host a namespace, lo up, and a veth pair: port p<i>
# on the bridge, $IFNAME with $NET.<i+1>/24 in the host.
setup_net() {
    local i ns
    ip -n "$NS_BR" link set lo up &&
        ip -n "$NS_BR" link add br0 type bridge &&
        ip -n "$NS_BR" link set br0 up || return 1
    for i in "${!NS_H[@]}"; do
        ns=${NS_H[i]}
        ip netns add "$ns" || return 1
        created+=("$ns")
        ip -n "$NS_BR" link add "p$i" type veth peer name "$IFNAME" netns "$ns" &&
            ip -n "$NS_BR" link set "p$i" master br0 up &&
            ip -n "$ns" link set lo up &&
            ip -n "$ns" addr add "$NET.$((i + 1))/24" dev "$IFNAME" &&
            ip -n "$ns" link set "$IFNAME" up || return 1
    done
}

links_up() {
    local ns
    for ns in "${NS_H[@]}"; do
        ip -n "$ns" link show "$IFNAME" | grep -q "state UP" || return 1
    done
}

# Every host's veth reports carrier (bounded, 5 s).
wait_links_up() {
    local i
    for ((i = 0; i < 50; i++)); do
        links_up && return 0
        sleep 0.1
    done
    return 1
}

if setup_net 2>"$tmp/setup.err" && wait_links_up; then
    ok "network: ${#NS_H[@]} hosts on a bridge, $NET.0/24"
else
    fail "network setup" "$(tr '\n' ' ' <"$tmp/setup.err")"
    echo "$passed passed, $failed failed"
    exit 1
fi

# What every rank of every host shares; the interface is the veth's prefix.
export HCCL_SOCKET_IFNAME=hccl
HCCL_COMM_SECRET=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
export HCCL_COMM_SECRET
export HCCL_CONNECT_TIMEOUT=60

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
