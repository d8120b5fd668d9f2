#!/usr/bin/env bash
# The tuner's constants: measured at start by default, taken from HCCL_COST_MODEL when set,
# the link class's defaults with HCCL_CALIBRATE=0; HCCL_TOPO_DUMP says which and shows the picks.
set -euo pipefail
run=$1 perf=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*" >&2; cat "$dir"/*.json >&2 || true; exit 1; }

dump() { # name, then environment assignments
  local name=$1; shift
  env "$@" HCCL_TOPO_DUMP="$dir/$name.json" "$run" -n 3 --timeout 120 "$perf" -b 8 -e 8 -n 1 -w 0 \
    >/dev/null || fail "run $name"
}

dump measured
grep -q '"source": "measured"' "$dir/measured.json" || fail "no measured model"
grep -q '"allreduce": {"8": "[a-z_]*", "4096": "[a-z_]*", "65536": "[a-z_]*"' "$dir/measured.json" || fail "no picks"
grep -q '"link_matrix": \[' "$dir/measured.json" || fail "no link matrix"

dump configured HCCL_COST_MODEL=7,3,12
grep -q '"source": "HCCL_COST_MODEL", "alpha_us": 7.000, "bandwidth_GBps": 3.000, "reduce_GBps": 12.000' \
  "$dir/configured.json" || fail "HCCL_COST_MODEL not applied"

dump default HCCL_CALIBRATE=0
grep -q '"class": "shm", "source": "default", "alpha_us": 30.000' "$dir/default.json" || fail "defaults"
echo "tuner model: ok"
