#!/usr/bin/env bash
# The soak: for MINUTES, job after job of random collectives, sizes, dtypes, ops, algorithms
# and communicators (split ones, and shrunk ones after a rank is killed), at 2 to 8 ranks over shm, tcp and two network-namespace
# hosts, with an HCCL_FAULT injected into about half of the jobs; every result and every error
# is checked (tests/mp/mp_soak.c). Prints the collectives run, faults injected, wrong results,
# hangs, unexpected errors, the survivors whose error is the fault's own code, and what the
# ranks and the machine held before and after (fds, threads, RSS, /dev/shm, processes).
# Usage: bench/soak.sh MINUTES [BUILD_DIR]   (BUILD_DIR: a configured build, default build)
# Exits 1 on a wrong result, a hang, an error without a fault, or anything left behind.
set -u
cd "$(dirname "$0")/.."
minutes=${1:?usage: bench/soak.sh MINUTES [BUILD_DIR]}
build=${2:-build}
RUN=$build/tools/hccl-run
SOAK=$build/tests/mp/mp_soak
JOB_TIMEOUT_S=90                 # a job that has not ended by then is a hang
ALGOS=(ring recdbl tree chain scatter_allgather bruck rechalv pairwise dissemination)

if [ ! -x "$RUN" ] || [ ! -x "$SOAK" ]; then
    cmake --build "$build" --target hccl-run mp_soak -j"$(nproc)" >/dev/null || exit 1
fi
RUN=$(realpath "$RUN")
SOAK=$(realpath "$SOAK")

shm_count() { find /dev/shm -maxdepth 1 -name 'hccl*' 2>/dev/null | wc -l; }
procs_count() { pgrep -c -x mp_soak 2>/dev/null || true; }
shm0=$(shm_count)
procs0=$(procs_count)

# Two hosts as network namespaces when we may make them (root, iproute2).
hosts=0
probe=hcclsoak$$
if [ "$(id -u)" -eq 0 ] && command -v ip >/dev/null && ip netns add "$probe" 2>/dev/null; then
    ip netns del "$probe"
    NETNS_HOSTS=2
    # shellcheck source=../tests/mp/netns_lib.sh
    . tests/mp/netns_lib.sh >/dev/null
    hosts=2
    unset HCCL_SOCKET_IFNAME         # set per job below: the local jobs use lo
else
    tmp=$(mktemp -d /tmp/hccl-soak.XXXXXX)
    trap 'rm -rf "$tmp"' EXIT
fi

jobs=0 colls=0 injected=0 wrong=0 hangs=0 unexpected=0 leaks=0 survivors=0 cause_kept=0
shrinks=0 shrinks_failed=0
rss_max=0
declare -A per_transport=()
fail_log=""
note() { fail_log+="  $*"$'\n'; }

# pick N: a random number in 0..N-1
pick() { echo $((RANDOM % $1)); }

deadline=$((SECONDS + minutes * 60))
port=30500
while [ "$SECONDS" -lt "$deadline" ]; do
    jobs=$((jobs + 1))
    seed=$((RANDOM * 32768 + RANDOM))
    iters=$((20 + $(pick 60)))
    split=$((5 + $(pick 25)))
    transport=shm
    case $(pick 4) in 1) transport=tcp ;; 2) [ "$hosts" -eq 2 ] && transport=hosts ;; esac
    if [ "$transport" = hosts ]; then n=$((2 * (1 + $(pick 4)))); else n=$((2 + $(pick 7))); fi
    # A short connect timeout: a bootstrap root that waits for a killed rank gives up soon
    # (the ranks count what is left after it, tests/mp/mp_soak.c).
    envs=(HCCL_CONNECT_TIMEOUT=8 HCCL_RUN_GRACE_S=30)
    [ "$transport" = tcp ] && envs+=(HCCL_LINKS=tcp)
    [ "$(pick 2)" -eq 0 ] && envs+=(HCCL_ALGO="${ALGOS[$(pick ${#ALGOS[@]})]}")
    fault="" want=""
    victim=$(pick "$n")
    seq=$(pick 40)
    case $(pick 8) in
    0 | 1) fault="kill:rank=$victim,seq=$seq" want=hcclRemoteError ;;
    2) fault="close:rank=$victim,peer=$(((victim + 1 + $(pick $((n - 1)))) % n)),seq=$seq" want=hcclRemoteError ;;
    3) fault="delay:rank=$victim,ms=4000,seq=$seq" want=hcclTimeout
       envs+=(HCCL_EXEC_TIMEOUT=1) ;;
    esac
    args=(--seed "$seed" --iters "$iters")
    # Half of the kills: the survivors shrink the dead rank out and go on (on the world
    # communicator only, where the fault's rank is the world rank).
    if [ "${fault%%:*}" = kill ] && [ "$(pick 2)" -eq 0 ] && [ "$n" -gt 2 ]; then
        args+=(--split-every 0 --shrink-out "$victim")
    else
        args+=(--split-every "$split")
    fi
    if [ -n "$fault" ]; then
        # Faults count collectives from the first: no start-up calibration before it.
        envs+=(HCCL_FAULT="$fault" HCCL_CALIBRATE=0)
        args+=(--fault)
    fi
    port=$((port + 1))
    out=$tmp/job.out err=$tmp/job.err
    : >"$out"
    : >"$err"
    if [ "$transport" = hosts ]; then
        pids=()
        for h in 0 1; do
            env "${envs[@]}" HCCL_SOCKET_IFNAME=hccl timeout -k 5 $((JOB_TIMEOUT_S + 10)) \
                ip netns exec "${NS_H[h]}" "$RUN" -n $((n / 2)) --world-size "$n" \
                --rank-offset $((h * n / 2)) --comm-id "$NET.1:$port" --timeout "$JOB_TIMEOUT_S" \
                "$SOAK" "${args[@]}" >>"$out" 2>>"$err" &
            pids+=($!)
        done
        rc=0
        for pid in "${pids[@]}"; do
            wait "$pid" || { r=$?; [ "$rc" -eq 124 ] || rc=$r; }
        done
        pids=()
    else
        env -u HCCL_SOCKET_IFNAME -u HCCL_COMM_ID "${envs[@]}" timeout -k 5 $((JOB_TIMEOUT_S + 10)) \
            "$RUN" -n "$n" --timeout "$JOB_TIMEOUT_S" "$SOAK" "${args[@]}" >"$out" 2>"$err"
        rc=$?
    fi
    what="job $jobs: $n ranks, $transport, ${fault:-no fault}, seed $seed, ${envs[*]}"
    per_transport[$transport]=$((${per_transport[$transport]:-0} + 1))
    if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
        hangs=$((hangs + 1))
        note "HANG $what"
        continue
    fi
    if [ -z "$fault" ] && [ "$rc" -ne 0 ]; then
        unexpected=$((unexpected + 1))
        note "EXIT $rc without a fault, $what: $(grep -v '^vm:' "$err" | tail -n 3 | tr '\n' ' ')"
    fi
    fired=0
    grep -q "HCCL_FAULT: rank [0-9]* \(kills\|closes\|stalls\)" "$err" && fired=1
    injected=$((injected + fired))
    killed=-1
    grep -q "HCCL_FAULT: rank $victim kills itself" "$err" && killed=$victim
    c=$(awk '/^SOAK rank [0-9]+ (ok|error|wrong) /{s += $6} END {print s + 0}' "$out")
    colls=$((colls + c))
    if grep -q "^SOAK rank .* WRONG\|^SOAK rank [0-9]* wrong" "$out"; then
        wrong=$((wrong + 1))
        note "WRONG $what: $(grep -m1 WRONG "$out")"
    fi
    for ((r = 0; r < n; r++)); do
        [ "$r" -eq "$killed" ] && continue
        line=$(grep -m1 "^SOAK rank $r \(ok\|error\|wrong\) " "$out")
        if [ -z "$line" ]; then
            unexpected=$((unexpected + 1))
            note "NO VERDICT from rank $r, $what"
            continue
        fi
        read -r _ _ _ verdict _ _ code _ fd0 fd1 _ th0 th1 _ _ rss1 _ shr _ <<<"$line"
        [ "${rss1:-0}" -gt "$rss_max" ] && rss_max=$rss1
        case $shr in
        ok) shrinks=$((shrinks + 1)) ;;
        FAILED)
            shrinks_failed=$((shrinks_failed + 1))
            note "SHRINK FAILED rank $r, $what: $(grep -m1 "SOAK shrink\|SOAK after" "$err")" ;;
        esac
        if [ "$fd0" != "$fd1" ] || [ "$th0" != "$th1" ]; then
            leaks=$((leaks + 1))
            note "LEAK rank $r fds $fd0->$fd1 threads $th0->$th1, $what"
        fi
        if [ "$verdict" = error ] && [ -z "$fault" ]; then
            unexpected=$((unexpected + 1))
            note "ERROR without a fault, rank $r, $what: ${line#*:: }"
        fi
        if [ "$fired" -eq 1 ] && [ "$r" -ne "$victim" ] && [ "$verdict" = error ]; then
            survivors=$((survivors + 1))
            [ "$code" = "$want" ] && cause_kept=$((cause_kept + 1))
        fi
    done
done

# A clean job last: it must succeed, and its set-up reclaims the segments that killed ranks
# left (tests/mp/cleanup_test.sh); after it nothing of ours may remain.
if ! env -u HCCL_SOCKET_IFNAME -u HCCL_COMM_ID timeout -k 5 $((JOB_TIMEOUT_S + 10)) "$RUN" -n 2 \
    --timeout "$JOB_TIMEOUT_S" "$SOAK" --seed 1 --iters 10 >"$tmp/last.out" 2>&1; then
    unexpected=$((unexpected + 1))
    note "the clean job after the soak failed: $(tail -n 3 "$tmp/last.out" | tr '\n' ' ')"
fi
shm1=$(shm_count)
procs1=$(procs_count)
transports=""
for t in "${!per_transport[@]}"; do transports+="$t ${per_transport[$t]}, "; done
echo "soak: $minutes min, $jobs jobs (${transports%, }), $colls collectives checked"
echo "  faults injected (fired): $injected"
echo "  wrong results: $wrong   hangs: $hangs   errors without a fault or missing verdicts: $unexpected"
echo "  survivors of a fault whose error is the fault's code: $cause_kept of $survivors"
echo "  survivors that shrank a killed rank out and went on: $shrinks (failed: $shrinks_failed)"
echo "  ranks whose fds or threads after destroy/abort differ from before init: $leaks"
echo "  largest rank RSS at exit: $rss_max KiB"
echo "  /dev/shm hccl segments: $shm0 before, $shm1 after; mp_soak processes: $procs0 before, $procs1 after"
[ -n "$fail_log" ] && printf '%s' "$fail_log"
[ "$wrong" -eq 0 ] && [ "$hangs" -eq 0 ] && [ "$unexpected" -eq 0 ] && [ "$leaks" -eq 0 ] &&
    [ "$shrinks_failed" -eq 0 ] &&
    [ "$shm1" -le "$shm0" ] && [ "$procs1" -le "$procs0" ]
