#!/usr/bin/env bash
# slurm_test.sh BUILD_DIR
# A real single-node Slurm from Debian's packages (munged, slurmctld, slurmd, a minimal
# slurm.conf in a temporary directory), then srun -n 4 --mpi=pmix of mp_collectives and of
# hccl-perf with no address given: Slurm's PMIx plugin (mpi_pmix_v4.so) carries the rendezvous.
# The daemons are stopped on every exit, failure included, and no rank may outlive its srun.
# Skips (77) where the Slurm or munge packages are missing or when not root (slurmd starts
# job steps as their user); in CI (CI=true) missing packages fail instead.
set -u
bin=$1
n=4
ranks=("$bin/tests/mp/mp_collectives" "$bin/tools/hccl-perf")

skip() {
  if [ "${CI:-}" = true ]; then
    echo "FAIL: $* (CI must run the Slurm test)"
    exit 1
  fi
  echo "SKIPPED: $*"
  exit 77
}
for cmd in munged slurmctld slurmd srun sinfo scancel; do
  command -v "$cmd" >/dev/null 2>&1 ||
    skip "$cmd is not installed (apt-get install slurmctld slurmd slurm-client munge slurm-wlm-basic-plugins)"
done
[ "$(id -u)" -eq 0 ] || skip "not root: slurmd must be root to start job steps"

tmp=$(mktemp -d)
chmod 755 "$tmp" # munged's socket must be reachable through it
export SLURM_CONF=$tmp/slurm.conf
pids=()

fail() {
  echo "FAIL: $*"
  for log in slurmctld.log slurmd.log munged.log; do
    [ -f "$tmp/$log" ] && { echo "--- $log"; tail -n 30 "$tmp/$log"; }
  done
  exit 1
}

# Waits until pid has exited, at most $2 seconds (tail --pid wakes when it goes).
wait_gone() {
  timeout "$2" tail --pid="$1" -f /dev/null 2>/dev/null
}

stop() {
  local pid
  scancel --quiet --full --user="$(id -un)" 2>/dev/null
  # Reverse order of start: slurmd, slurmctld, munged; each gets 15 s after SIGTERM.
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
    pid=${pids[i]}
    kill -TERM "$pid" 2>/dev/null || continue
    wait_gone "$pid" 15 || kill -KILL "$pid" 2>/dev/null
  done
  # Ranks of this build that a killed step left behind (the check below says so too).
  for pid in $(pgrep -f "^($bin/tests/mp/mp_collectives|$bin/tools/hccl-perf)( |$)"); do
    kill -KILL "$pid" 2>/dev/null
  done
  rm -rf "$tmp"
}
trap stop EXIT

# Waits, without polling, until file has a line containing pattern, at most $3 seconds.
wait_log() {
  local file=$1 pattern=$2 deadline=$((SECONDS + $3)) line found=1
  coproc TAILER { exec tail -n +1 -F "$file" 2>/dev/null; }
  while [ "$SECONDS" -lt "$deadline" ] &&
    IFS= read -r -t $((deadline - SECONDS)) line <&"${TAILER[0]}"; do
    if [[ $line == *"$pattern"* ]]; then
      found=0
      break
    fi
  done
  kill "$TAILER_PID" 2>/dev/null
  wait "$TAILER_PID" 2>/dev/null
  return $found
}

# shellcheck source=port_lib.sh
. "$(dirname "$0")/port_lib.sh"

# munge: a fresh key and a private socket; it forks once it serves (-f: /tmp is group-writable).
if command -v mungekey >/dev/null 2>&1; then
  mungekey --create --keyfile="$tmp/munge.key" || fail "mungekey"
else
  (umask 077 && head -c 1024 /dev/urandom >"$tmp/munge.key")
fi
munged --force --socket="$tmp/munge.sock" --key-file="$tmp/munge.key" --log-file="$tmp/munged.log" \
  --pid-file="$tmp/munged.pid" --seed-file="$tmp/munged.seed" || fail "munged did not start"
pids+=("$(cat "$tmp/munged.pid")")

host=$(hostname -s)
mkdir -p "$tmp/state" "$tmp/spool"
# CPUs is more than this machine has (config_overrides lets slurmd accept it): 4 tasks fit on
# any machine, as they do under mpirun --oversubscribe. No cgroups: proctrack/pgid, task/none.
ctld_port=$(free_port) || fail "no free port for slurmctld"
while d_port=$(free_port) && [ "$d_port" = "$ctld_port" ]; do :; done
[ -n "$d_port" ] || fail "no free port for slurmd"
cat >"$SLURM_CONF" <<EOF
ClusterName=hccltest
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$d_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$tmp/munge.sock
CredType=cred/munge
StateSaveLocation=$tmp/state
SlurmdSpoolDir=$tmp/spool
SlurmctldPidFile=$tmp/slurmctld.pid
SlurmdPidFile=$tmp/slurmd.pid
SlurmctldLogFile=$tmp/slurmctld.log
SlurmdLogFile=$tmp/slurmd.log
MailProg=/bin/true
ProctrackType=proctrack/pgid
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
MpiDefault=none
ReturnToService=2
NodeName=$host NodeAddr=127.0.0.1 CPUs=16 State=UNKNOWN
PartitionName=hccl Nodes=$host Default=YES MaxTime=10 State=UP
EOF
slurmctld -D -i -f "$SLURM_CONF" >"$tmp/slurmctld.out" 2>&1 &
pids+=($!)
wait_log "$tmp/slurmctld.out" "Running as primary controller" 60 || fail "slurmctld did not come up"
slurmd -D -f "$SLURM_CONF" -N "$host" >"$tmp/slurmd.out" 2>&1 &
pids+=($!)
wait_log "$tmp/slurmd.out" "slurmd started" 60 || fail "slurmd did not come up"
srun --mpi=list 2>&1 | grep -q pmix || fail "srun lists no pmix plugin (slurm-wlm-basic-plugins)"

# srun waits for the node to register, then runs; its own limit (-t, minutes) and ours bound it.
run() {
  timeout -k 10 200 srun -t 3 -n "$n" --mpi=pmix "$@" >"$tmp/out" 2>&1
  rc=$?
  cat "$tmp/out"
  if pgrep -f "^($bin/tests/mp/mp_collectives|$bin/tools/hccl-perf)( |$)" >/dev/null; then
    fail "ranks outlived srun"
  fi
}
count() { grep -c "$1" "$tmp/out"; }

unset HCCL_COMM_ID RANK_ID RANK WORLD_SIZE MASTER_ADDR MASTER_PORT
HCCL_DEBUG=INFO HCCL_DEBUG_SUBSYS=INIT run "${ranks[0]}"
[ "$rc" -eq 0 ] || fail "srun of mp_collectives exited $rc"
[ "$(count ': all collectives checked$')" -eq "$n" ] || fail "not every rank checked every collective"
[ "$(count "hccl INFO rank [0-9]* of $n from PMIx")" -eq "$n" ] ||
  fail "not every rank took its rank and rendezvous from Slurm's PMIx"

run "${ranks[1]}" -C all -b 8 -e 1M -f 32 -n 2 -w 1
[ "$rc" -eq 0 ] || fail "srun of hccl-perf exited $rc"
grep -q "^# Out of bounds values : 0 OK$" "$tmp/out" || fail "hccl-perf found wrong results"
[ "$(count "^# [a-z]*: $n ranks, ")" -eq 6 ] || fail "hccl-perf did not run 6 collectives at $n ranks"
echo "PASS: srun -n $n --mpi=pmix, mp_collectives and hccl-perf"
