# Sourced by the multi-process tests that set up a listener themselves (a rendezvous, slurmctld).
#
# free_port: a TCP port on 127.0.0.1 that nothing listens on now, below the kernel's ephemeral
# range. A port inside the range, even one just bound and closed, can meanwhile be taken by any
# process's outgoing connection or port-0 listener; below it only a program that names the
# port can take it (hccl-run picks its own the same way). Prints nothing and fails if none of
# 50 tries was free.
free_port() {
    local p low
    read -r low _ </proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || low=32768
    [ "$low" -gt 20100 ] || low=32768
    for _ in $(seq 50); do
        p=$((20000 + RANDOM % (low - 20000)))
        # A refused connection: nothing listens there.
        if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
            echo "$p"
            return 0
        fi
    done
    return 1
}
