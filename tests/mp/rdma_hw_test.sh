#!/usr/bin/env bash
# The rdma link on a real device (RoCE, InfiniBand, or soft-RoCE rdma_rxe): the collectives and
# hccl-perf with HCCL_LINKS=rdma, each rank its own "host". Without a device it says SKIPPED and
# exits 77 (ctest's skip code). Usage: rdma_hw_test.sh hccl-run hccl-perf mp_collectives
set -euo pipefail
run=$1 perf=$2 coll=$3
fail() { echo "FAIL: $*" >&2; exit 1; }

devices=""
if command -v ibv_devices >/dev/null 2>&1; then
  devices=$(ibv_devices 2>/dev/null | awk 'NR > 2 && NF { print $1 }' | tr '\n' ' ')
elif [[ -d /sys/class/infiniband ]]; then
  devices=$(ls /sys/class/infiniband 2>/dev/null | tr '\n' ' ')
fi
if [[ -z ${devices// } ]]; then
  echo "SKIPPED: no RDMA device (ibv_devices lists none; see README, RDMA, for soft-RoCE)"
  exit 77
fi
echo "rdma devices: $devices"
export HCCL_LINKS=rdma HCCL_CONNECT_TIMEOUT=${HCCL_CONNECT_TIMEOUT:-60}
one_host_each='HCCL_HOST_ID=host$RANK exec "$0" "$@"'

log=$(mktemp)
trap 'rm -f "$log"' EXIT
HCCL_DEBUG=INFO HCCL_DEBUG_SUBSYS=INIT,LINK "$run" -n 2 --timeout 120 --tag-output \
  sh -c "$one_host_each" "$coll" >"$log" 2>&1 || { cat "$log"; fail "mp_collectives over rdma, 2 ranks"; }
grep -q "rdma to rank" "$log" || { cat "$log"; fail "no rdma connection in the log"; }
"$run" -n 4 --timeout 240 --tag-output sh -c "$one_host_each" "$coll" \
  || fail "mp_collectives over rdma, 4 ranks"
# Sizes on both sides of the zero-copy threshold, checked.
"$run" -n 2 --timeout 120 sh -c "$one_host_each" "$perf" -C all -b 8 -e 4M -f 8 -n 5 -w 2 \
  || fail "hccl-perf over rdma"
echo "rdma: ok"
