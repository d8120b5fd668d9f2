#!/usr/bin/env bash
# topo_test.sh HCCL_RUN HCCL_TOPO: hccl-topo's table and JSON on two "hosts" of two ranks
# (shm inside each, tcp between), on tcp only, and on one rank.
set -u
run=$1 topo=$2
fail() { echo "FAIL: $*" >&2; exit 1; }
two_hosts() { "$run" -n 4 --timeout 120 sh -c 'HCCL_HOST_ID=h$((RANK / 2)) exec "$0" "$@"' "$topo" "$@"; }

out=$(two_hosts) || fail "table run: $out"
echo "$out"
grep -q "^hccl-topo: 4 ranks on 2 hosts" <<<"$out" || fail "header"
grep -Eq "^host 1  h1  2 ranks: 2 3$" <<<"$out" || fail "hosts"
grep -Eq "^ +0 +- +shm +tcp +tcp$" <<<"$out" || fail "row 0 of the link matrix"
grep -Eq "^ +3 +tcp +tcp +shm +-$" <<<"$out" || fail "row 3 of the link matrix"
grep -Eq "^  shm  ranks 0-1  latency +[0-9.]+ us  bandwidth +[0-9.]+ GB/s$" <<<"$out" || fail "shm measured"
grep -Eq "^  tcp  ranks 0-2  latency +[0-9.]+ us  bandwidth +[0-9.]+ GB/s$" <<<"$out" || fail "tcp measured"
grep -Eq "^allreduce( +[a-z_]+){6}$" <<<"$out" || fail "allreduce picks"
grep -Eq "^alltoall( +[a-z_]+){6}$" <<<"$out" || fail "alltoall picks"

json=$(two_hosts --json) || fail "json run: $json"
grep -q '"link_matrix": \[' <<<"$json" || fail "json link matrix"
grep -q '\["tcp", "tcp", "shm", "self"\]' <<<"$json" || fail "json row 3"
grep -Eq '\{"link": "tcp", "ranks": \[0, 2\], "latency_us": [0-9.]+, "bandwidth_GBps": [0-9.]+\}' <<<"$json" \
  || fail "json tcp class"
grep -q '"allreduce": {"8": "[a-z_]*"' <<<"$json" || fail "json picks"
if command -v python3 >/dev/null; then
  python3 -c 'import json,sys; json.load(sys.stdin)' <<<"$json" || fail "not JSON: $json"
fi

out=$(HCCL_LINKS=tcp "$run" -n 3 --timeout 120 "$topo" --no-measure) || fail "tcp-only run: $out"
grep -Eq "^ +1 +tcp +- +tcp$" <<<"$out" || fail "tcp-only matrix: $out"
grep -q "link classes" <<<"$out" && fail "--no-measure measured"

out=$("$run" -n 1 --timeout 60 "$topo") || fail "one rank: $out"
grep -q "^hccl-topo: 1 rank on 1 host$" <<<"$out" || fail "one rank: $out"
echo "PASS"
