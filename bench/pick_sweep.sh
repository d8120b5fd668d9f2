#!/usr/bin/env bash
# pick_sweep.sh [build-dir]: does the tuner pick the fastest algorithm?
#
# For every collective, at 2, 4 and 8 ranks (shm, this host) and at 8 B, 64 KiB, 1 MiB and
# 64 MiB (nccl-tests sizes, float32 sum; for AllGather, ReduceScatter and AlltoAll the
# smallest is 8 B per rank), runs hccl-perf once with the tuner's choice and
# once per algorithm forced with -a, and prints per cell the tuner's pick (read from the
# INFO log of the plan it built; the lane where it built none), the time of each algorithm
# (the lane's only at the sizes it takes) and whether the pick was the
# fastest (or within PICK_TOLERANCE of it: runs on this 2-core machine vary by that much).
#
#   PICK_NPS="2 4 8" PICK_SIZES=8,64K,1M,64M PICK_TIME=0.3 PICK_REPS=3 PICK_TOLERANCE=10
#   PICK_COLLS="allreduce broadcast reduce allgather reducescatter alltoall"
#
# Writes results/pick_<stamp>/pick.csv (one row per run: collective, nranks, size, algo,
# time_us, rep) and pick.md (the table). Each time is the median of PICK_REPS runs,
# interleaved so that noise spreads over all algorithms alike.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
build=${1:-$repo/build-release}
nps=${PICK_NPS:-"2 4 8"}
sizes=${PICK_SIZES:-8,64K,1M,64M}
budget=${PICK_TIME:-0.3}
reps=${PICK_REPS:-3}
tol=${PICK_TOLERANCE:-10}
out=$here/results/pick_$(date -u +%Y%m%dT%H%M%SZ)
mkdir -p "$out"

if [[ ! -x $build/tools/hccl-perf ]]; then
  cmake -S "$repo" -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build "$build" -j"$(nproc)" --target hccl-perf hccl-run >/dev/null
fi
run=$build/tools/hccl-run perf=$build/tools/hccl-perf

declare -A algos=(
  [allreduce]="lane ring recdbl rabenseifner tree"
  [broadcast]="lane tree chain scatter_allgather"
  [reduce]="lane tree chain"
  [allgather]="lane ring recdbl bruck"
  [reducescatter]="lane ring rechalv"
  [alltoall]="lane pairwise bruck"
)
colls=${PICK_COLLS:-"allreduce broadcast reduce allgather reducescatter alltoall"}

echo "collective,nranks,size,algo,time_us,rep" >"$out/pick.csv"
echo "collective,nranks,size,pick" >"$out/picks.csv"
for rep in $(seq 1 "$reps"); do
  for np in $nps; do
    for coll in $colls; do
      for algo in auto ${algos[$coll]}; do
        # The smallest size of the block collectives is per rank: 8 B of 8 ranks is 1 B each.
        cs=$sizes
        case $coll in allgather | reducescatter | alltoall)
          first=${sizes%%,*}
          [[ $first =~ ^[0-9]+$ ]] && cs=$((first * np))${sizes#"$first"} ;;
        esac
        args=(-C "$coll" -s "$cs" -T "$budget" -w 2 -c 0 -p oop --csv)
        [[ $algo == auto ]] || args+=(-a "$algo")
        log=$out/run.log
        # The pick is in the INFO line of each plan rank 0 builds for a float32 call.
        HCCL_DEBUG=INFO HCCL_DEBUG_SUBSYS=ALGO HCCL_DEBUG_FILE="$out/info.%r.log" \
          "$run" -n "$np" --timeout 600 "$perf" "${args[@]}" >"$log" 2>&1 || {
          echo "pick_sweep: $coll np=$np $algo failed:" >&2; tail -5 "$log" >&2; exit 1; }
        # Sizes that rank 0 built a plan for (the lane builds none), as bytes like hccl-perf's.
        # "rank 0: allgather of 16384 x float32 (sum) on 4 ranks: ring, 12 steps"; the start-up
        # calibration's own AllReduces take max.
        line="rank 0: $coll of [0-9]* x float32 (sum) on $np ranks:"
        { grep -h "$line" "$out"/info.0.log || true; } |
          sed -E "s/.* of ([0-9]+) x float32 \(sum\) on [0-9]+ ranks: ([a-z_]+),.*/\1 \2/" |
          while read -r count pick; do
            case $coll in allgather | reducescatter | alltoall) bytes=$((count * 4 * np)) ;;
              *) bytes=$((count * 4)) ;; esac
            echo "$bytes $pick"
          done | sort -u >"$out/planned"
        # Forced to the lane, a size past its reach runs a plan: that time is not the lane's.
        grep -E '^[a-z]+,[0-9]+,' "$log" |
          awk -F, -v np="$np" -v a="$algo" -v rep="$rep" -v planned="$out/planned" '
            BEGIN { while ((getline l < planned) > 0) { split(l, f, " "); plan[f[1]] = f[2] } }
            a == "lane" && ($2 in plan) { next }
            {print $1 "," np "," $2 "," a "," $8 "," rep}' >>"$out/pick.csv"
        if [[ $algo == auto && $rep == 1 ]]; then
          # The pick of each size: its plan's algorithm, or the lane where no plan was built.
          grep -E '^[a-z]+,[0-9]+,' "$log" | cut -d, -f2 | sort -u |
            while read -r bytes; do
              pick=$(awk -v b="$bytes" '$1 == b {print $2}' "$out/planned")
              echo "$coll,$np,$bytes,${pick:-lane}"
            done >>"$out/picks.csv"
        fi
        rm -f "$out"/info.*.log
      done
    done
  done
done

python3 - "$out" "$tol" <<'EOF'
import csv, statistics, sys
from collections import defaultdict
out, tol = sys.argv[1], float(sys.argv[2])
times = defaultdict(list)
for r in csv.DictReader(open(f"{out}/pick.csv")):
    times[(r["collective"], int(r["nranks"]), int(r["size"]), r["algo"])].append(float(r["time_us"]))
picks = {(r["collective"], int(r["nranks"]), int(r["size"])): r["pick"]
         for r in csv.DictReader(open(f"{out}/picks.csv"))}
cells = sorted({k[:3] for k in times}, key=lambda k: (k[0], k[1], k[2]))
def human(b):
    for unit, f in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= f and b % f == 0: return f"{b // f} {unit}"
    return f"{b} B"
lines = ["| collective | ranks | size | pick | pick's time (us) | fastest | its time (us) | every algorithm (us) | verdict |",
         "|---|---|---|---|---|---|---|---|---|"]
ok = total = 0
for c in cells:
    med = {k[3]: statistics.median(v) for k, v in times.items() if k[:3] == c and k[3] != "auto"}
    if not med: continue
    best = min(med, key=med.get)
    pick = picks.get(c, "?")
    pt = med.get(pick)
    total += 1
    if pt is None: verdict = "pick not measured"
    elif pick == best: verdict = "fastest"; ok += 1
    elif pt <= med[best] * (1 + tol / 100): verdict = f"within {tol:.0f}%"; ok += 1
    else: verdict = f"{pt / med[best]:.2f}x the fastest"
    every = ", ".join(f"{a} {t:.1f}" for a, t in sorted(med.items(), key=lambda x: x[1]))
    lines.append(f"| {c[0]} | {c[1]} | {human(c[2])} | {pick} | {pt if pt is None else f'{pt:.1f}'} | "
                 f"{best} | {med[best]:.1f} | {every} | {verdict} |")
lines.append("")
lines.append(f"{ok} of {total} cells: the pick is the fastest or within {tol:.0f}% of it.")
open(f"{out}/pick.md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
print(f"\nwritten: {out}/pick.md, pick.csv, picks.csv")
EOF
