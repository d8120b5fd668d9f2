#!/usr/bin/env bash
# pmix_test.sh BUILD_DIR CASE [N]
# hcclCommInitFromEnv under Open MPI's mpirun, whose PMIx server carries the rendezvous:
#   collectives N   mp_collectives at N ranks, no address given: every rank forms through PMIx
#   commid N        the same with HCCL_COMM_ID set: the given address wins over PMIx
#   multi           several communicators per process, PMIx_Init/PMIx_Finalize balanced
#   absent          a rank never calls in: the others get hcclTimeout within the connect timeout
#   kill            a rank killed mid-AllReduce: mpirun ends, naming it; with --enable-recovery
#                   (mpirun leaves the survivors running) every survivor reports hcclRemoteError
# Each mpirun runs under a hard time bound, and no rank may outlive it.
# Skips (77) where mpirun.openmpi is not installed, except in CI (CI=true), where it fails.
set -u
bin=$1 case=$2 n=${3:-4}
mpirun=$(command -v mpirun.openmpi || command -v mpirun || true)
if [ -z "$mpirun" ] || ! "$mpirun" --version 2>/dev/null | grep -qE "OpenRTE|Open MPI"; then
  if [ "${CI:-}" = true ]; then
    echo "FAIL: Open MPI's mpirun is not installed (openmpi-bin): CI must run the mpirun tests"
    exit 1
  fi
  echo "SKIPPED: Open MPI's mpirun is not installed (apt-get install openmpi-bin)"
  exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

fail() { echo "FAIL: $case: $*"; exit 1; }

# mpirun with a bound of its own (--timeout) and ours (timeout -k), then the check that none
# of the ranks of this build's programs is left.
launch() {
  local np=$1
  shift
  timeout -k 5 150 "$mpirun" --allow-run-as-root --oversubscribe --timeout 120 -np "$np" "$@" \
    >"$tmp/out" 2>&1
  rc=$?
  cat "$tmp/out"
  if pgrep -f "^$bin/tests/mp/mp_" >/dev/null; then
    pgrep -af "^$bin/tests/mp/mp_"
    pkill -9 -f "^$bin/tests/mp/mp_"
    fail "ranks outlived mpirun"
  fi
  [ "$rc" -ne 124 ] || fail "mpirun did not end within its bound"
}

count() { grep -c "$1" "$tmp/out"; }

# shellcheck source=port_lib.sh
. "$(dirname "$0")/port_lib.sh"

export HCCL_CONNECT_TIMEOUT=${HCCL_CONNECT_TIMEOUT:-60}
unset HCCL_COMM_ID RANK_ID RANK WORLD_SIZE MASTER_ADDR MASTER_PORT
case $case in
collectives)
  HCCL_DEBUG=INFO HCCL_DEBUG_SUBSYS=INIT launch "$n" "$bin/tests/mp/mp_collectives"
  [ "$rc" -eq 0 ] || fail "mpirun exited $rc"
  [ "$(count ': all collectives checked$')" -eq "$n" ] || fail "not every rank checked every collective"
  [ "$(count 'hccl INFO rank [0-9]* of '"$n"' from PMIx')" -eq "$n" ] ||
    fail "not every rank took its rank and rendezvous from PMIx"
  ;;
commid)
  port=$(free_port) || fail "no free port below the ephemeral range"
  HCCL_COMM_ID=127.0.0.1:$port HCCL_DEBUG=INFO HCCL_DEBUG_SUBSYS=INIT launch "$n" \
    "$bin/tests/mp/mp_collectives"
  [ "$rc" -eq 0 ] || fail "mpirun exited $rc"
  [ "$(count ': all collectives checked$')" -eq "$n" ] || fail "not every rank checked every collective"
  [ "$(count "from the Open MPI environment, rendezvous 127.0.0.1:$port\$")" -eq "$n" ] ||
    fail "not every rank used HCCL_COMM_ID"
  [ "$(count 'from PMIx')" -eq 0 ] || fail "a rank used PMIx although HCCL_COMM_ID was set"
  ;;
multi)
  launch "$n" "$bin/tests/mp/mp_pmix" multi 3
  [ "$rc" -eq 0 ] || fail "mpirun exited $rc"
  [ "$(count 'communicators of .* from PMIx ok$')" -eq "$n" ] || fail "a rank failed"
  ;;
absent)
  mkfifo "$tmp/fifo"
  HCCL_CONNECT_TIMEOUT=3 launch "$n" "$bin/tests/mp/mp_pmix" absent "$tmp/fifo"
  [ "$rc" -eq 0 ] || fail "mpirun exited $rc"
  [ "$(count ': hcclTimeout after [0-9.]* s ok: .*PMIx fence')" -eq $((n - 1)) ] ||
    fail "not every present rank got hcclTimeout from the fence"
  slow=$(grep -oE 'hcclTimeout after [0-9.]+ s' "$tmp/out" | awk '$3 > 10' | wc -l)
  [ "$slow" -eq 0 ] || fail "a rank waited much longer than the connect timeout of 3 s"
  ;;
kill)
  victim=$((n / 2))
  # What a user gets: mpirun sees the rank die, ends the job and says so.
  launch "$n" "$bin/tests/mp/mp_allreduce" --kill-rank "$victim"
  [ "$rc" -ne 0 ] || fail "mpirun exited 0 although rank $victim was killed"
  grep -q "rank $victim .* on signal 9" "$tmp/out" || fail "mpirun did not name rank $victim"
  if grep -E "^rank [0-9]+: " "$tmp/out" | grep -v -E "remote error|survivor ok"; then
    fail "a survivor reported something other than a remote error"
  fi
  # With the survivors left to finish, each must have had its error.
  launch "$n" --enable-recovery "$bin/tests/mp/mp_allreduce" --kill-rank "$victim"
  [ "$(count '^rank [0-9]*: survivor ok$')" -eq $((n - 1)) ] ||
    fail "not every survivor reported hcclRemoteError and aborted cleanly"
  ;;
*)
  fail "unknown case"
  ;;
esac
echo "PASS: $case $n"
