#!/usr/bin/env bash
# launch_multihost.sh: run an hccl program over several hosts, started by hccl-run on
# each host or by another launcher (torchrun, srun, mpirun).
#
# 1. hccl-run on each host (run this once per host; host a owns the rendezvous address):
#      host a: HCCL_COMM_SECRET=$S launch_multihost.sh --nnodes 2 --node-rank 0 \
#                  --nproc-per-node 4 --master a:29500 -- ./prog args
#      host b: HCCL_COMM_SECRET=$S launch_multihost.sh --nnodes 2 --node-rank 1 \
#                  --nproc-per-node 4 --master a:29500 -- ./prog args
#    (NNODES, NODE_RANK, NPROC_PER_NODE may come from the environment instead.)
# 2. Under another launcher, as the program it starts on every rank:
#      torchrun --nnodes 2 --nproc-per-node 4 --master-addr a --master-port 29500 \
#          --no-python launch_multihost.sh -- ./prog args         # RANK, WORLD_SIZE, LOCAL_RANK
#      srun -N 2 --ntasks-per-node 4 launch_multihost.sh -- ./prog args  # SLURM_PROCID, ...
#      mpirun -np 8 -x HCCL_COMM_SECRET launch_multihost.sh --master a:29501 -- ./prog args
#    The script reads the launcher's rank, size and local rank (torchrun; Slurm; Open MPI
#    OMPI_COMM_WORLD_*; MPICH/Hydra PMI_RANK, PMI_SIZE, MPI_LOCALRANKID), sets what
#    hcclCommInitFromEnv reads first (HCCL_COMM_ID, RANK_ID, WORLD_SIZE, LOCAL_RANK) and
#    execs the program.
#
# The rendezvous ("host:port", where global rank 0 listens) is, first found: --master;
# HCCL_COMM_ID; MASTER_ADDR, or under Slurm the first host of SLURM_JOB_NODELIST, with the
# port HCCL_PORT, else MASTER_PORT + 1 (torchrun's own store already listens on MASTER_PORT),
# else 29501.
#
# Other options: --ifname IF sets HCCL_SOCKET_IFNAME (the interface the hosts share);
# --timeout S stops this host's ranks after S seconds (hccl-run mode); --hccl-run PATH.
# Every host must see the same HCCL_COMM_SECRET (hex): it authenticates the rendezvous.
set -euo pipefail

usage() {
    sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2
    exit 2
}
die() {
    echo "launch_multihost.sh: $*" >&2
    exit 2
}

mode=auto master="" timeout="" hccl_run=""
nnodes=${NNODES:-} node_rank=${NODE_RANK:-} nproc=${NPROC_PER_NODE:-}
while [ $# -gt 0 ]; do
    case $1 in
    --mode) mode=$2; shift 2 ;;
    --nnodes) nnodes=$2; shift 2 ;;
    --node-rank) node_rank=$2; shift 2 ;;
    --nproc-per-node) nproc=$2; shift 2 ;;
    --master) master=$2; shift 2 ;;
    --ifname) export HCCL_SOCKET_IFNAME=$2; shift 2 ;;
    --timeout) timeout=$2; shift 2 ;;
    --hccl-run) hccl_run=$2; shift 2 ;;
    -h | --help) usage ;;
    --) shift; break ;;
    *) break ;;
    esac
done
[ $# -ge 1 ] || usage

# Started by another launcher when one of its rank variables is set.
if [ "$mode" = auto ]; then
    mode=hccl-run
    for v in RANK SLURM_PROCID OMPI_COMM_WORLD_RANK PMI_RANK; do
        if [ -n "${!v:-}" ]; then
            mode='env'
            break
        fi
    done
fi

rendezvous() {
    local host="" port
    if [ -n "$master" ]; then
        echo "$master"
        return
    fi
    if [ -n "${HCCL_COMM_ID:-}" ]; then
        echo "$HCCL_COMM_ID"
        return
    fi
    if [ -n "${MASTER_ADDR:-}" ]; then
        host=$MASTER_ADDR
    elif [ -n "${SLURM_JOB_NODELIST:-}" ] && command -v scontrol >/dev/null; then
        host=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
    fi
    [ -n "$host" ] || die "no rendezvous address: pass --master host:port or set MASTER_ADDR"
    if [ -n "${HCCL_PORT:-}" ]; then
        port=$HCCL_PORT
    elif [ -n "${MASTER_PORT:-}" ]; then
        port=$((MASTER_PORT + 1))
    else
        port=29501
    fi
    echo "$host:$port"
}

is_count() { [[ $1 =~ ^[0-9]+$ ]]; }

case $mode in
hccl-run)
    if ! is_count "$nnodes" || ! is_count "$node_rank" || ! is_count "$nproc"; then
        die "hccl-run mode needs --nnodes, --node-rank and --nproc-per-node (or NNODES, NODE_RANK, NPROC_PER_NODE)"
    fi
    [ "$node_rank" -lt "$nnodes" ] || die "--node-rank $node_rank is not below --nnodes $nnodes"
    [ -n "$master" ] || [ -n "${HCCL_COMM_ID:-}" ] || [ "$nnodes" -eq 1 ] ||
        die "several hosts need --master host:port (an address of node 0's host)"
    if [ -z "$hccl_run" ]; then
        hccl_run=$(command -v hccl-run || true)
        [ -n "$hccl_run" ] || die "hccl-run is not on PATH: pass --hccl-run PATH"
    fi
    [ -n "${HCCL_COMM_SECRET:-}" ] || [ "$nnodes" -eq 1 ] ||
        echo "launch_multihost.sh: HCCL_COMM_SECRET is not set: the rendezvous is not authenticated" >&2
    args=(-n "$nproc" --world-size $((nnodes * nproc)) --rank-offset $((node_rank * nproc)))
    if [ "$nnodes" -gt 1 ] || [ -n "$master" ]; then
        comm_id=$(rendezvous) || exit 2
        args+=(--comm-id "$comm_id")
    fi
    [ -n "$timeout" ] && args+=(--timeout "$timeout")
    exec "$hccl_run" "${args[@]}" --tag-output -- "$@"
    ;;
env)
    if [ -n "${RANK:-}" ]; then
        rank=$RANK size=${WORLD_SIZE:-} local=${LOCAL_RANK:-0}
    elif [ -n "${SLURM_PROCID:-}" ]; then
        rank=$SLURM_PROCID size=${SLURM_NTASKS:-} local=${SLURM_LOCALID:-0}
    elif [ -n "${OMPI_COMM_WORLD_RANK:-}" ]; then
        rank=$OMPI_COMM_WORLD_RANK size=${OMPI_COMM_WORLD_SIZE:-} local=${OMPI_COMM_WORLD_LOCAL_RANK:-0}
    elif [ -n "${PMI_RANK:-}" ]; then
        rank=$PMI_RANK size=${PMI_SIZE:-} local=${MPI_LOCALRANKID:-0}
    else
        die "env mode: no launcher rank variable (RANK, SLURM_PROCID, OMPI_COMM_WORLD_RANK, PMI_RANK)"
    fi
    if ! is_count "$rank" || ! is_count "$size" || [ "$rank" -ge "$size" ]; then
        die "env mode: rank '$rank' and size '$size' from the launcher are not valid"
    fi
    HCCL_COMM_ID=$(rendezvous) || exit 2
    export HCCL_COMM_ID RANK_ID=$rank WORLD_SIZE=$size LOCAL_RANK=$local
    exec "$@"
    ;;
*)
    die "--mode is auto, hccl-run or env, not '$mode'"
    ;;
esac
