# Sourced by netns_test.sh and chaos_test.sh: several "hosts" on one machine, each a network
# namespace with one veth into a bridge that lives in a namespace of its own. Set NETNS_HOSTS
# (how many hosts) before sourcing. Provides ok/fail/skip, the counters, $tmp, cleanup on exit,
# NS_H (the hosts' namespaces), IFNAME and NET (host i is $NET.<i+1> on $IFNAME), and exports
# what every rank shares (HCCL_SOCKET_IFNAME, HCCL_COMM_SECRET, HCCL_CONNECT_TIMEOUT).
TAG=hccl$$                      # every namespace we make starts with this
NS_BR=$TAG-br                   # holds the bridge
NS_H=()
for ((i = 0; i < ${NETNS_HOSTS:?set NETNS_HOSTS before sourcing netns_lib.sh}; i++)); do NS_H+=("$TAG-h$i"); done
IFNAME=hccl0                    # each host's veth, inside its namespace
NET=10.99.$(($$ % 250 + 1))     # hosts are $NET.1, $NET.2, ...: private to the namespaces
passed=0
failed=0
created=()                      # namespaces made so far, deleted on any exit
pids=()                         # launchers (their timeout(1)) running now

skip() {
    echo "SKIPPED: $*"
    exit 0
}

command -v ip >/dev/null 2>&1 || skip "iproute2 is not installed (no 'ip' command)"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/hccl-netns.XXXXXX") || exit 1

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

