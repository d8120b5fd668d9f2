#!/usr/bin/env bash
# compare.sh [quick|full] - hccl against Open MPI, MPICH and Gloo on this host.
#
# Builds hccl (Release) and the peers' benchmark programs (bench/src), then,
# for each repetition, measures the machine's limits (memcpy, process_vm_readv,
# TCP loopback, a copy across two cores) and, for each rank count, runs every library in turn over the
# same collectives and sizes (interleaved, so that noise spreads evenly over
# the libraries), waiting before each run until the CPUs are quiet. Results go
# to bench/results/<UTC stamp>/: results.csv (every row), medians.csv,
# table.md (hccl / best peer, hccl / limit), plots (*.png), logs/. See
# bench/README.md for the columns.
#
#   quick   2 and 8 ranks, 16 B .. 64 MiB in x4 steps, 3 repetitions     (~6 min)
#   full    2, 4 and 8 ranks, 8 B .. 256 MiB in x2 steps, 3 repetitions  (~35 min)
#
# Knobs (environment): BENCH_REPS (default 3), BENCH_LIBS (default
# "hccl hccl-tcp ompi ompi-tcp mpich mpich-tcp gloo"), BENCH_NRANKS,
# BENCH_COLLS (one collective, or all), BENCH_SIZES (e.g. "-b 1K -e 1M -f 4"),
# BENCH_SKIP_OVERSUB (libraries not run with more ranks than cores, default
# mpich-tcp), BENCH_BUILD (default /tmp/bench-build),
# BENCH_OUT (default bench/results/<stamp>), BENCH_QUIET_PCT (25),
# BENCH_QUIET_WAIT (seconds, quick 10, full 20), BENCH_BASELINE (default: the newest
# bench/baselines/*.csv; table.md ends with the run against it).
# Every library but gloo also runs as LIB-async (hccl-async, hccl-tcp-async, ompi-async, ...):
# its non-blocking calls, each waited at once (Async + hcclWait; MPI_I* + MPI_Wait), e.g.
# BENCH_LIBS="hccl hccl-async ompi ompi-async".
set -euo pipefail

mode=${1:-quick}
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
case $mode in
quick)
    nranks_def="2 8" sizes=(-b 16 -e 64M -f 4) limit_sizes=4K,16K,64K,256K,1M,4M,16M,64M
    budget=0.02 warm=2 guard=1 run_limit=300 quiet_def=10 ;;
full)
    nranks_def="2 4 8" sizes=(-b 8 -e 256M -f 2) limit_sizes=4K,16K,64K,256K,1M,4M,16M,64M,256M
    # -w 0: the sizing runs of -T (at least one call, in hccl-perf and the
    # peers) and the peers' checked first call come before the timed calls
    # anyway; at 256 MiB a call costs a second.
    budget=0.02 warm=0 guard=2 run_limit=900 quiet_def=20 ;;
*)
    echo "usage: $0 [quick|full]" >&2
    exit 2 ;;
esac
reps=${BENCH_REPS:-3}
if [[ -n ${BENCH_SIZES:-} ]]; then read -ra sizes <<<"$BENCH_SIZES"; fi
libs=${BENCH_LIBS:-"hccl hccl-tcp ompi ompi-tcp mpich mpich-tcp gloo"}
nranks=${BENCH_NRANKS:-$nranks_def}
# MPICH over TCP busy-polls: with more ranks than cores it takes minutes per
# sweep and only shows that (the slowest by far); it runs where ranks <= cores.
skip_oversub=${BENCH_SKIP_OVERSUB:-mpich-tcp}
colls=${BENCH_COLLS:-all}
build=${BENCH_BUILD:-/tmp/bench-build}
quiet_pct=${BENCH_QUIET_PCT:-25}
quiet_wait=${BENCH_QUIET_WAIT:-$quiet_def}
out=${BENCH_OUT:-$here/results/$(date -u +%Y%m%dT%H%M%SZ)}
cores=$(nproc)
mkdir -p "$out/logs" "$build"
t_start=$SECONDS

log() { echo "[$(date -u +%H:%M:%S) +$((SECONDS - t_start))s] $*" | tee -a "$out/run.log"; }

# Two benchmarks at once would measure each other (and share $build): a
# second compare.sh waits here for the first to end.
exec 9>"${TMPDIR:-/tmp}/hccl-bench-compare.lock"
if ! flock -n 9; then
    log "another compare.sh is running: waiting for it to end"
    flock 9
fi

# ------------------------------------------------------------------ packages
# Both MPIs install mpicc/mpirun through alternatives: every call below names
# its MPI explicitly (mpicc.openmpi, mpirun.openmpi, mpicc.mpich, mpiexec.mpich).
pkgs=(gcc g++ make cmake pkg-config libevent-dev openmpi-bin libopenmpi-dev mpich libmpich-dev
    libgloo-dev gnuplot-nox python3 time)
missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
    if ((EUID == 0)); then
        log "installing ${missing[*]}"
        { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}"; } \
            >>"$out/run.log" 2>&1 || log "apt-get failed (see run.log); libraries without their packages are skipped"
    else
        log "missing packages: ${missing[*]} (run as root to install them); their libraries are skipped"
    fi
fi

# --------------------------------------------------------------------- build
log "mode=$mode reps=$reps nranks='$nranks' libs='$libs' out=$out"
log "building hccl (Release) in $build/hccl and the peers in $build"
hccl_perf=$build/hccl/tools/hccl-perf
# build_hccl SRC DIR: hccl-perf and hccl-run (Release) from the tree SRC into DIR.
build_hccl() {
    cmake -S "$1" -B "$2" -DCMAKE_BUILD_TYPE=Release -DHCCL_BUILD_TESTS=OFF \
        -DHCCL_BUILD_EXAMPLES=OFF >>"$out/run.log" 2>&1 &&
        cmake --build "$2" -j"$cores" --target hccl-perf hccl-run >>"$out/run.log" 2>&1
}
build_hccl "$repo" "$build/hccl" || { log "building hccl failed (see $out/run.log)"; exit 1; }
# hccl at BENCH_REF: its own tree (git archive) and build, its own hccl-run and hccl-perf.
rm -f "$build/hccl-ref/tools/hccl-perf"
if [[ -n ${BENCH_REF:-} ]]; then
    log "building hccl at $BENCH_REF (Release) in $build/hccl-ref"
    rm -rf "$build/hccl-ref-src" && mkdir -p "$build/hccl-ref-src"
    { git -C "$repo" archive "$BENCH_REF" | tar -x -C "$build/hccl-ref-src"; } 2>>"$out/run.log" &&
        build_hccl "$build/hccl-ref-src" "$build/hccl-ref" ||
        log "building hccl at $BENCH_REF failed (see $out/run.log)"
fi
# The peers' programs: one that does not build is not run (no stale binary).
rm -f "$build/limits" "$build/mpi_perf.ompi" "$build/mpi_perf.mpich" "$build/gloo_perf"
build_peer() { # NAME CMD...
    "${@:2}" >>"$out/run.log" 2>&1 || log "building $1 failed (see run.log)"
}
build_peer limits gcc -O2 -Wall -o "$build/limits" "$here/src/limits.c"
if command -v mpicc.openmpi >/dev/null; then
    build_peer ompi mpicc.openmpi -O2 -Wall -o "$build/mpi_perf.ompi" "$here/src/mpi_perf.c"
fi
if command -v mpicc.mpich >/dev/null; then
    build_peer mpich mpicc.mpich -O2 -Wall -o "$build/mpi_perf.mpich" "$here/src/mpi_perf.c"
fi
if [[ -f /usr/include/gloo/allreduce.h ]]; then
    build_peer gloo g++ -O2 -std=c++17 -Wall -o "$build/gloo_perf" "$here/src/gloo_perf.cc" -lgloo -pthread
fi

# Which libraries can run: a missing toolchain drops its library.
have_lib() {
    case ${1%-async} in
    hccl | hccl-tcp) [[ -x $hccl_perf ]] ;;
    hccl-ref | hccl-ref-tcp) [[ -x $build/hccl-ref/tools/hccl-perf ]] ;;
    ompi | ompi-tcp) [[ -x $build/mpi_perf.ompi ]] ;;
    mpich | mpich-tcp) [[ -x $build/mpi_perf.mpich ]] ;;
    gloo) [[ -x $build/gloo_perf ]] ;;
    *) return 1 ;;
    esac
}
run_libs=()
for l in $libs; do
    if have_lib "$l"; then run_libs+=("$l"); else log "skipping $l (not built)"; fi
done

{
    echo "date_utc: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "mode: $mode, reps: $reps, nranks: $nranks, libs: ${run_libs[*]}"
    echo "args: ${sizes[*]} -T $budget -w $warm (peers: -G $guard)"
    echo "cpu: $(lscpu | sed -n 's/^Model name: *//p'), $cores cores"
    echo "mem: $(free -g | awk '/^Mem:/{print $2" GiB"}'), kernel $(uname -r)"
    echo "hccl: $(git -C "$repo" log -1 --format='%h %s' 2>/dev/null | cut -c1-80)"
    [[ -z ${BENCH_REF:-} ]] ||
        echo "hccl-ref: $(git -C "$repo" log -1 --format='%h %s' "$BENCH_REF" 2>/dev/null | cut -c1-80)"
    for p in openmpi-bin mpich libgloo-dev gcc; do
        echo "$p: $(dpkg-query -W -f='${Version}' "$p" 2>/dev/null || echo none)"
    done
    echo "loadavg at start: $(cut -d' ' -f1-3 /proc/loadavg)"
} >"$out/machine.txt"

# ------------------------------------------------------- quiet CPU, accounting
# The machine is shared: before each run wait (at most quiet_wait s, and
# 4 x quiet_wait in all) until the CPUs were at most quiet_pct % busy over 1 s,
# and record how much CPU other processes used during the run.
quiet_left=$((quiet_wait * 4))
cpu_busy_pct() {
    local a b ta=0 tb=0 k
    read -ra a </proc/stat
    sleep 1
    read -ra b </proc/stat
    for k in 1 2 3 4 5 6 7 8; do
        ta=$((ta + a[k])) tb=$((tb + b[k]))
    done
    echo $(((tb - ta) > 0 ? 100 * ((tb - ta) - (b[4] - a[4]) - (b[5] - a[5])) / (tb - ta) : 0))
}
wait_quiet() { # sets BUSY (percent) and WAITED (seconds)
    WAITED=0
    BUSY=$(cpu_busy_pct)
    while ((BUSY > quiet_pct && WAITED < quiet_wait && quiet_left > 0)); do
        sleep 1
        WAITED=$((WAITED + 2)) quiet_left=$((quiet_left - 2))
        BUSY=$(cpu_busy_pct)
    done
}
clk=$(getconf CLK_TCK)
# CPU ticks: all CPUs busy (user+nice+system+irq+softirq), and this shell's reaped children
cpu_all() { local s; read -ra s </proc/stat; echo $((s[1] + s[2] + s[3] + s[6] + s[7])); }
cpu_own() { local s; read -ra s </proc/$$/stat; echo $((s[15] + s[16])); }

echo "lib,nranks,rep,what,rc,wall_s,own_cpu_s,other_cpu_s,busy_before_pct,waited_s,load1" >"$out/runs.csv"
# measured LABEL NRANKS REP WHAT CMD...: run CMD quietly, with accounting
measured() {
    local label=$1 n=$2 r=$3 what=$4 rc=0
    shift 4
    wait_quiet
    local load1 a0 o0 t0
    load1=$(cut -d' ' -f1 /proc/loadavg) a0=$(cpu_all) o0=$(cpu_own) t0=$(date +%s.%N)
    "$@" || rc=$?
    local wall own other
    wall=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}')
    own=$(($(cpu_own) - o0)) other=$(($(cpu_all) - a0))
    other=$((other > own ? other - own : 0))
    echo "$label,$n,$r,$what,$rc,$wall,$(awk -v o=$own -v x=$other -v c="$clk" \
        'BEGIN{printf "%.1f,%.1f", o/c, x/c}'),$BUSY,$WAITED,$load1" >>"$out/runs.csv"
    ((rc == 0)) || log "    $label n=$n rep=$r $what: exit status $rc (see logs/)"
    return 0
}

# ---------------------------------------------------------------- launchers
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# launch LIB N CMD-ARGS...: N ranks of LIB's benchmark with ARGS; rank 0's CSV
# on stdout. $wrap (e.g. /usr/bin/time) goes in front of each rank.
wrap=()
launch() {
    local lib=$1 n=$2
    shift 2
    # LIB-async: the same library through its non-blocking calls, each waited at once
    # (hccl: Async + hcclWait; MPI: MPI_I* + MPI_Wait). The flag comes last, so it wins.
    if [[ $lib == *-async ]]; then
        launch "${lib%-async}" "$n" "$@" -z 0
        return
    fi
    local ompi=(mpirun.openmpi --allow-run-as-root -np "$n" --mca btl_tcp_if_include lo
        --mca oob_tcp_if_include lo)
    if ((n > cores)); then
        ompi+=(--oversubscribe) # Open MPI refuses more ranks than cores otherwise
    fi
    case $lib in
    # Blocking calls (-z 1), as the peers' MPI_Allreduce & co.; the in-flight run overrides it.
    # hccl-ref*: the build of BENCH_REF; *-tcp: HCCL_LINKS=tcp.
    hccl | hccl-tcp | hccl-ref | hccl-ref-tcp)
        local dir=$build/${lib%-tcp} links=()
        [[ $lib != *-tcp ]] || links=(HCCL_LINKS=tcp)
        env "${links[@]}" timeout -k 10 "$run_limit" "$dir/tools/hccl-run" -n "$n" "${wrap[@]}" \
            "$dir/tools/hccl-perf" -p oop -z 1 "$@" ;;
    ompi) timeout -k 10 "$run_limit" "${ompi[@]}" "${wrap[@]}" "$build/mpi_perf.ompi" -G "$guard" "$@" ;;
    ompi-tcp)
        timeout -k 10 "$run_limit" "${ompi[@]}" --mca pml ob1 --mca btl tcp,self \
            "${wrap[@]}" "$build/mpi_perf.ompi" -G "$guard" "$@" ;;
    # MPICH is ch4:ucx here: UCX picks shared memory on one host; UCX_NET_DEVICES
    # and -iface only keep UCX and Hydra off other interfaces.
    mpich)
        UCX_NET_DEVICES=lo timeout -k 10 "$run_limit" mpiexec.mpich -iface lo -np "$n" \
            "${wrap[@]}" "$build/mpi_perf.mpich" -G "$guard" "$@" ;;
    # MPICH over UCX's TCP transport hangs in MPI_Finalize more often than not
    # (UCX 1.13): mpi_perf skips it (see src/mpi_perf.c).
    mpich-tcp)
        MPIR_CVAR_NOLOCAL=1 UCX_TLS=tcp,self UCX_NET_DEVICES=lo MPI_PERF_NO_FINALIZE=1 \
            timeout -k 10 "$run_limit" mpiexec.mpich -iface lo -np "$n" \
            "${wrap[@]}" "$build/mpi_perf.mpich" -G "$guard" "$@" ;;
    gloo) gloo_launch "$n" -G "$guard" "$@" ;;
    esac
}
# Gloo has no launcher: N processes meet through a FileStore in a fresh
# directory; when one fails, the others are stopped instead of waiting for
# Gloo's timeout.
gloo_launch() {
    local n=$1 r rc=0 st left store
    shift
    store=$(mktemp -d "$build/gloo-store.XXXXXX")
    local pids=()
    for ((r = 0; r < n; r++)); do
        if ((r == 0)); then
            GLOO_RANK=$r GLOO_SIZE=$n GLOO_STORE=$store timeout -k 10 "$run_limit" \
                "${wrap[@]}" "$build/gloo_perf" "$@" &
        else
            GLOO_RANK=$r GLOO_SIZE=$n GLOO_STORE=$store timeout -k 10 "$run_limit" \
                "${wrap[@]}" "$build/gloo_perf" "$@" >/dev/null &
        fi
        pids+=($!)
    done
    for ((left = n; left > 0; left--)); do
        st=0
        wait -n || st=$? # any rank (they are the only jobs of this shell now)
        if ((st != 0 && rc == 0)); then
            rc=$st
            kill "${pids[@]}" 2>/dev/null || true
        fi
    done
    rm -rf "$store"
    return "$rc"
}

# run_lib LIB N REP: the sweep; rows go to results.csv with lib and rep first
echo "lib,rep,collective,size,count,type,redop,root,placement,time_us,algbw,busbw,wrong,nranks,algo" \
    >"$out/results.csv"
# Results are checked in the first repetition (the check costs a fill and a
# call per size in hccl-perf), only timed in the others.
run_lib() {
    local lib=$1 n=$2 r=$3 f=$out/logs/${1}_n${2}_r${3}
    local rc=0
    launch "$lib" "$n" -C "$colls" "${sizes[@]}" -T "$budget" -w "$warm" -c $((r == 1)) -d float32 -o sum --csv \
        >"$f.csv" 2>"$f.log" || rc=$?
    # Hydra's cleanup after ranks that skipped MPI_Finalize: the rows are complete
    if ((rc != 0 && rc != 124)) && [[ ${lib%-async} == mpich-tcp ]] && grep -q "all rows written" "$f.log"; then
        rc=0
    fi
    return "$rc"
}
append_rows() { # LIB REP FILE DEST: the CSV rows of FILE (no header), prefixed
    grep -E '^[a-z]+,[0-9]+,' "$3" | sed "s/^/$1,$2,/" >>"$4" || true
}

# hccl only: 8 allreduces of 1 MiB in flight (-N 8) against one at a time, both on one buffer
# set (-N 1, which stays in cache) and on the same 8 buffer sets (-N 8 -z 1: 16 MiB per rank,
# which does not). The inflight column is "1", "8" or "8seq".
echo "lib,rep,inflight,collective,size,count,type,redop,root,placement,time_us,algbw,busbw,wrong,nranks,algo" \
    >"$out/inflight.csv"
run_inflight() {
    local n=$1 r=$2 k f
    for k in 1 8 8seq; do
        f=$out/logs/hccl-N${k}_n${n}_r${r}
        launch hccl "$n" -C allreduce -b 1M -e 1M -T "$budget" -w "$warm" -c 0 -N "${k%seq}" \
            -z "$([ "$k" = 8seq ] && echo 1 || echo 0)" --csv >"$f.csv" 2>"$f.log" ||
            return $?
        grep -E '^[a-z]+,[0-9]+,' "$f.csv" | sed "s/^/hccl,$r,$k,/" >>"$out/inflight.csv" || true
    done
}

# Peak RSS per rank at 8 ranks, 1 MiB allreduce (buffers: 2 x 1 MiB per rank
# in every program), from /usr/bin/time's maximum resident set size.
echo "lib,nranks,ranks_reported,rank_rss_max_kib,rank_rss_mean_kib" >"$out/rss.csv"
run_rss() {
    local lib=$1 f=$out/logs/rss_$1
    rm -f "$f.kib"
    wrap=(/usr/bin/time -f %M -a -o "$f.kib")
    launch "$lib" 8 -C allreduce -b 1M -e 1M -n 20 -w 2 -c 0 --csv >"$f.csv" 2>"$f.log" || true
    wrap=()
    [[ -s $f.kib ]] && grep -E '^[0-9]+$' "$f.kib" |
        awk -v l="$lib" '{s+=$1; if($1>m)m=$1} END{if(NR) printf "%s,8,%d,%d,%d\n", l, NR, m, s/NR}' >>"$out/rss.csv"
    return 0
}

# ---------------------------------------------------------------------- runs
echo "rep,limit,size,gbps" >"$out/limits.csv"
run_limits() {
    "$build/limits" "$limit_sizes" >"$out/logs/limits_r$1.csv" 2>&1 || return $?
    tail -n +2 "$out/logs/limits_r$1.csv" | sed "s/^/$1,/" >>"$out/limits.csv"
}
runs_at() { # LIB N: does LIB run at N ranks?
    ((${2} <= cores)) || [[ " $skip_oversub " != *" ${1%-async} "* ]]
}
for ((rep = 1; rep <= reps; rep++)); do
    log "repetition $rep of $reps: limits"
    measured limits 2 "$rep" limits run_limits "$rep"
    # Each repetition starts one library later, so that no library always
    # runs right after the same other one.
    k=$(((rep - 1) % ${#run_libs[@]}))
    order=("${run_libs[@]:k}" "${run_libs[@]:0:k}")
    for n in $nranks; do
        for lib in "${order[@]}"; do
            runs_at "$lib" "$n" || continue
            log "repetition $rep of $reps: $lib, $n ranks"
            measured "$lib" "$n" "$rep" sweep run_lib "$lib" "$n" "$rep"
            append_rows "$lib" "$rep" "$out/logs/${lib}_n${n}_r${rep}.csv" "$out/results.csv"
        done
        if [[ " ${run_libs[*]} " == *" hccl "* ]]; then
            log "repetition $rep of $reps: hccl -N 1 / -N 8, $n ranks"
            measured hccl "$n" "$rep" inflight run_inflight "$n" "$rep"
        fi
    done
    if ((rep == 1)); then
        for lib in "${run_libs[@]}"; do
            runs_at "$lib" 8 || continue
            log "peak RSS: $lib, 8 ranks"
            measured "$lib" 8 "$rep" rss run_rss "$lib"
        done
    fi
done
echo "loadavg at end: $(cut -d' ' -f1-3 /proc/loadavg)" >>"$out/machine.txt"
echo "elapsed_s: $((SECONDS - t_start))" >>"$out/machine.txt"

log "summarising"
python3 "$here/summarize.py" "$out" "$cores" >>"$out/run.log" 2>&1 || log "summarize.py failed (see run.log)"
# The newest dated baseline (bench/baselines, kept in git) or BENCH_BASELINE: hccl's
# figures now against then, appended to table.md.
baseline=${BENCH_BASELINE:-$(ls "$here"/baselines/*.csv 2>/dev/null | sort | tail -n 1)}
if [[ -n $baseline && -f $out/medians.csv ]]; then
    { echo; python3 "$here/baseline.py" diff "$baseline" "$out"; } >>"$out/table.md" 2>>"$out/run.log" ||
        log "baseline.py diff failed (see run.log)"
fi
log "done in $((SECONDS - t_start)) s: $out/table.md"
