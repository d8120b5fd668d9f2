#!/usr/bin/env bash
# examples_test.sh HCCL_RUN EXAMPLES_DIR CASE
# Runs one example (examples/README.md) through hccl-run, time-bounded, and checks its
# exit status and output. Each CASE is its own ctest (tests/mp/CMakeLists.txt).
set -u
run=$1 dir=$2 case=$3
script=$(cd "$(dirname "$0")/../../examples" && pwd)/launch_multihost.sh
tmp=$(mktemp -d "${TMPDIR:-/tmp}/hccl-examples-test.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
export HCCL_SOCKET_IFNAME=lo

fail() {
    echo "FAIL ($case): $*"
    exit 1
}
# launch N ARGS...: the example through the launcher; output in $tmp/out, status in $rc.
launch() {
    local n=$1
    shift
    timeout 100 "$run" -n "$n" --timeout 80 --tag-output "$@" >"$tmp/out" 2>&1
    rc=$?
    cat "$tmp/out"
}
has() { grep -qE -- "$1" "$tmp/out" || fail "no line matching: $1"; }
count() { grep -cE -- "$1" "$tmp/out"; }
passed() {
    [ "$rc" -eq 0 ] || fail "the launcher exited $rc"
}

# shellcheck source=port_lib.sh
. "$(dirname "$0")/port_lib.sh"

case $case in
primitives)
    launch 4 "$dir/primitives"
    passed
    has "^\[0\]: primitives: all results checked on every rank$"
    [ "$(count '^\[0\]: (allreduce|broadcast|allgather|reducescatter|alltoall).* ok$')" -eq 18 ] ||
        fail "want 18 checked collectives (6 calls x 3 counts)"
    ;;
primitives_tcp)
    HCCL_LINKS=tcp launch 3 "$dir/primitives" 1 1000 33333
    passed
    has "^\[0\]: primitives: all results checked on every rank$"
    ;;
comm_init)
    launch 4 "$dir/comm_init"
    passed
    has "^\[0\]: comm_init: InitFromEnv, InitRank \(unique id\), InitGroup and 2 DP x 2 TP split checked$"
    has "^\[3\]: rank 3: world 3/4, TP group 1 \(rank 1 of 2\), DP group 1 \(rank 1 of 2\)$"
    ;;
elastic_training | elastic_training_tcp)
    # Rank 2 of 4 dies at step 20: the launcher reports it, the three others shrink and finish.
    [ "$case" = elastic_training_tcp ] && export HCCL_LINKS=tcp
    HCCL_RUN_GRACE_S=60 launch 4 "$dir/elastic_training" --steps 40 --kill-rank 2 --kill-step 20
    [ "$rc" -ne 124 ] || fail "the job hit its time bound"
    has "rank 2 .*killed by signal 9"
    # A survivor may finish step 19 and fail at 20, or fail at 19 (its data from rank 2 lost).
    has "^\[0\]: elastic_training: rank 2 died at step 20; 4 -> 3 ranks, shrunk in [0-9.]+ ms; went on from step (19|20); 40 steps$"
    has "^\[0\]: elastic_training: PASS: weights of 4096 doubles match the reference on all 3 ranks$"
    [ "$(count 'step (19|20) failed: remote error')" -eq 3 ] || fail "want 3 survivors reporting the failed step"
    ;;
overlap_training)
    launch 2 "$dir/overlap_training" --iters 2 --width 256
    passed
    has "^\[0\]:   \(a\) overlapped +[0-9.]+ ms/iter$"
    has "^\[0\]:   \(c\) compute +[0-9.]+ ms/iter$"
    has "^\[0\]:   communication hidden: "
    has "weights bit-identical on all 2 ranks: yes$"
    ;;
overlap_training_device)
    launch 4 "$dir/overlap_training" --iters 2 --width 128 --layers 12 --compute device
    passed
    has "compute on the device$"
    has "^\[0\]:   \(a\) overlapped +[0-9.]+ ms/iter$"
    has "^\[0\]:   communication hidden: "
    has "weights bit-identical on all 4 ranks: yes$"
    ;;
event_loop)
    launch 2 "$dir/event_loop" --steps 2 --mib 64
    passed
    has "^\[0\]: event_loop: 2 ranks, 2 steps of a 64 MiB \+ a 1 KiB AllReduce"
    has "^\[0\]:   timer lateness while AllReduces ran +[1-9][0-9]* ticks  p50 +[0-9.]+ us  p99 +[0-9.]+ us  max"
    has "^\[0\]: event_loop: worst rank while busy: .*; all results checked on every rank$"
    ;;
epoll_loop)
    launch 4 "$dir/epoll_loop" --total 48 --window 3
    passed
    [ "$(count '^\[[0-3]\]: rank [0-3]: 48 AllReduces \(3 in flight\)')" -eq 4 ] || fail "a rank did not finish"
    has "^\[0\]: epoll_loop: all results and completion counts checked on every rank$"
    ;;
callback_chain)
    launch 3 "$dir/callback_chain" --stages 12 --count 5000
    passed
    has "^\[0\]: callback_chain: 3 ranks, 12 stages of 5000 int64: .*every stage checked on every rank$"
    ;;
hang_mismatch)
    # The signature check names both calls on every rank.
    HCCL_CHECK=1 launch 4 "$dir/hang_diagnosis" mismatch
    passed
    has "^\[0\]: hang_diagnosis mismatch: 4 ranks saw the fault themselves, 0 failed .*: ok$"
    both='rank 0 called allreduce\(count 1024, float32, sum\), rank 1 called allreduce\(count 2048'
    [ "$(count "returned invalid usage after .*$both")" -eq 4 ] ||
        fail "every rank must name both calls"
    # Without it: the ranks that receive a mismatched message name it, the rest fail with them.
    launch 4 "$dir/hang_diagnosis" mismatch
    passed
    has "returned invalid usage after .*collective mismatch at seq [0-9]+: rank [0-9] called allreduce"
    ;;
hang_collective)
    HCCL_CHECK=1 launch 4 "$dir/hang_diagnosis" collective
    passed
    has "^\[0\]: rank 0: hcclBroadcast\(1024 x float32, root 0\) returned invalid usage .*\
rank 0 called broadcast\(count 1024, float32, root 0\), rank 1 called allreduce"
    has "^\[0\]: hang_diagnosis collective: 4 ranks saw the fault themselves"
    ;;
hang_skip)
    HCCL_EXEC_TIMEOUT=3 launch 3 "$dir/hang_diagnosis" skip
    passed
    # The watchdog's state dump shows who waits on the rank that skipped, then the timeout. A
    # 4 KiB AllReduce takes the shm lane where ranks share CPUs (HCCL_LANE_MAX), a plan elsewhere.
    if [ "$(count "\(1024 x float32, sum\): shm lane, waiting on ranks 0$")" -gt 0 ]; then
        has "^\[[12]\]:   request allreduce seq [0-9]+ \(1024 x float32, sum\): shm lane, waiting on ranks 0$"
    else
        has "^\[[12]\]:   request allreduce seq [0-9]+ \(1024 x float32, sum\): algorithm [a-z]+, [0-9]+ of"
        has "^\[[12]\]:     step [0-9]+ recv from rank 0 .*: posted, waiting on rank 0$"
    fi
    # Every rank names the root cause: the rank that skipped the call.
    has "returned timeout after [0-9.]+ s: .*root cause at rank 0: rank 0 did not take part in allreduce seq [0-9]+ within the exec timeout of 3000 ms"
    has "^\[0\]: hang_diagnosis skip: .*0 unexpected: ok$"
    ;;
hang_missing)
    HCCL_CONNECT_TIMEOUT=3 launch 3 "$dir/hang_diagnosis" missing
    passed
    has "^\[2\]: rank 2: not joining"
    named='2 of 3 ranks joined before the connect timeout; missing ranks: 2$'
    [ "$(count "hcclCommInitFromEnv returned timeout after .*$named")" -eq 2 ] ||
        fail "both ranks that joined must name the missing one"
    ;;
hang_dead)
    HCCL_RUN_GRACE_S=20 launch 4 "$dir/hang_diagnosis" dead
    [ "$rc" -ne 0 ] || fail "the launcher exited 0 although rank 3 was killed"
    has "rank 3 .*killed by signal 9"
    [ "$(count '^\[[0-2]\]: rank [0-2]: diagnosis ok: remote error')" -eq 3 ] ||
        fail "every survivor must get hcclRemoteError"
    [ "$(count '^\[[0-2]\]: rank [0-2]: hcclCommGetAsyncError: remote error')" -eq 3 ] ||
        fail "every survivor's communicator must report hcclRemoteError"
    ;;
non_pow2)
    launch 8 "$dir/non_pow2" --iters 2
    passed
    has "^\[0\]:   8 ranks, AllReduce algorithm by message bytes: \{"
    has "^\[0\]:   6 ranks, AllReduce algorithm by message bytes: \{"
    [ "$(count '^\[0\]:   [68] ranks: +[0-9]+ elements .* us/call  ok$')" -eq 6 ] || fail "want 6 checked sizes"
    has "^\[0\]: non_pow2: all results checked on every rank$"
    ;;
multihost_hccl_run)
    # Two "hosts" on this machine: one script per host, each starting its 2 ranks with hccl-run.
    port=$(free_port) || fail "no free port below the ephemeral range"
    export HCCL_COMM_SECRET=00112233445566778899aabbccddeeff HCCL_DEBUG=INFO HCCL_DEBUG_SUBSYS=LINK
    for node in 0 1; do
        HCCL_HOST_ID=host$node timeout 100 "$script" --nnodes 2 --node-rank $node --nproc-per-node 2 \
            --master "127.0.0.1:$port" --timeout 80 --hccl-run "$run" -- "$dir/primitives" 1 1000 \
            >"$tmp/node$node" 2>&1 &
        pids[node]=$!
    done
    wait "${pids[0]}"
    rc0=$?
    wait "${pids[1]}"
    rc1=$?
    cat "$tmp/node0" "$tmp/node1" >"$tmp/out"
    grep -v " INFO " "$tmp/out"
    if [ "$rc0" -ne 0 ] || [ "$rc1" -ne 0 ]; then
        fail "the hosts' launchers exited $rc0 and $rc1"
    fi
    grep -q "^\[0\]: primitives: all results checked on every rank$" "$tmp/node0" || fail "rank 0 did not check"
    grep -qE "^\[2\]: .*rank 2: tcp connection to rank 0 .* is up" "$tmp/node1" || fail "no tcp between the hosts"
    grep -qE "^\[3\]: .*rank 3: shm link to rank 2 .* is up" "$tmp/node1" || fail "no shm inside host 1"
    ;;
multihost_torchrun | multihost_slurm | multihost_mpi)
    # Another launcher's environment, emulated under hccl-run (which bounds the time and cleans
    # up): the script must turn it into hcclCommInitFromEnv's. Ranks 0-1 are host0, 2-3 host1.
    # hccl-run's own rendezvous port is free (nobody else uses it here): the script gets it.
    clear='env -u RANK_ID -u RANK -u WORLD_SIZE -u LOCAL_RANK -u HCCL_COMM_ID -u LOCAL_WORLD_SIZE'
    # shellcheck disable=SC2016 # $RANK and the others expand in each rank's shell
    case $case in
    multihost_torchrun)
        # torchrun's store holds MASTER_PORT: the script takes the next port.
        vars='RANK=$RANK WORLD_SIZE=$WORLD_SIZE LOCAL_RANK=$((RANK % 2)) MASTER_ADDR=127.0.0.1'
        vars+=' MASTER_PORT=$((${HCCL_COMM_ID##*:} - 1))' ;;
    multihost_slurm)
        vars='SLURM_PROCID=$RANK SLURM_NTASKS=$WORLD_SIZE SLURM_LOCALID=$((RANK % 2))'
        vars+=' MASTER_ADDR=127.0.0.1 HCCL_PORT=${HCCL_COMM_ID##*:}' ;;
    multihost_mpi)
        vars='OMPI_COMM_WORLD_RANK=$RANK OMPI_COMM_WORLD_SIZE=$WORLD_SIZE'
        vars+=' OMPI_COMM_WORLD_LOCAL_RANK=$((RANK % 2))'
        extra='--master $HCCL_COMM_ID' ;;
    esac
    HCCL_DEBUG=INFO HCCL_DEBUG_SUBSYS=LINK launch 4 bash -c \
        "exec $clear $vars HCCL_HOST_ID=host\$((RANK / 2)) \"\$0\" ${extra:-} -- \"\$1\" 1 1000" \
        "$script" "$dir/primitives" >/dev/null
    grep -v " INFO " "$tmp/out"
    passed
    has "^\[0\]: primitives: all results checked on every rank$"
    has "^\[2\]: .*rank 2: tcp connection to rank 0 .* is up"
    has "^\[3\]: .*rank 3: shm link to rank 2 .* is up"
    ;;
*)
    fail "unknown case"
    ;;
esac
echo "PASS: $case"
