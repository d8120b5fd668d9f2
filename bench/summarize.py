#!/usr/bin/env python3
"""summarize.py RESULTS_DIR [CORES] - medians, table.md and plots of a compare.sh run.

Reads results.csv, limits.csv, inflight.csv, rss.csv, runs.csv and machine.txt
from RESULTS_DIR; writes medians.csv, table.md and plots/<collective>.png
(gnuplot). Only the standard library: it runs wherever compare.sh does.
"""
import csv
import math
import os
import statistics
import subprocess
import sys
from collections import defaultdict

COLLS = ["allreduce", "broadcast", "reduce", "allgather", "reducescatter", "alltoall"]
LIBS = ["hccl", "hccl-async", "hccl-tcp", "hccl-tcp-async", "ompi", "ompi-async", "ompi-tcp",
        "ompi-tcp-async", "mpich", "mpich-async", "mpich-tcp", "mpich-tcp-async", "gloo",
        "hccl-ref", "hccl-ref-async", "hccl-ref-tcp", "hccl-ref-tcp-async"]
# hccl at BENCH_REF (compare.sh): each of hccl's runs against the same run of that commit.
REF_KINDS = ["hccl", "hccl-async", "hccl-tcp", "hccl-tcp-async"]
PEERS = ["ompi", "ompi-tcp", "mpich", "mpich-tcp", "gloo"]
TCP_PEERS = ["ompi-tcp", "mpich-tcp", "gloo"]
# The non-blocking runs (LIB-async: Async + hcclWait, MPI_I* + MPI_Wait) against each other.
ASYNC_PEERS = ["ompi-async", "ompi-tcp-async", "mpich-async", "mpich-tcp-async"]
TCP_ASYNC_PEERS = ["ompi-tcp-async", "mpich-tcp-async"]
# (hccl's run, the peers it is set against, the column's name for them)
PAIRS = [("hccl", PEERS, "best"), ("hccl-tcp", TCP_PEERS, "best tcp"),
         ("hccl-async", ASYNC_PEERS, "best async"), ("hccl-tcp-async", TCP_ASYNC_PEERS, "best tcp async")]
SMALL = 1024  # below this, tables show times (latency) instead of busbw
LARGE = 64 << 10  # from this size on, busbw is set against the machine's limits


def read_csv(path):
    if not os.path.exists(path):
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def human(size):
    for unit, div in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if size >= div and size % div == 0:
            return f"{size // div}{unit}"
    return str(size)


def fmt(v, digits=3):
    if v is None:
        return "-"
    if v == 0:
        return "0"
    mag = math.floor(math.log10(abs(v)))
    return f"{v:.{max(0, digits - 1 - mag)}f}"


def busbw_factor(coll, n):
    return 2 * (n - 1) / n if coll == "allreduce" else (n - 1) / n if coll in (
        "allgather", "reducescatter", "alltoall") else 1.0


def medians(rows):
    """Per (lib, collective, nranks, size): the median time over repetitions,
    and algbw/busbw recomputed from it (the CSVs round them to 1e-4 GB/s,
    which is all there is of them at small sizes). The peers measure one
    placement (broadcast is 'ip' in every library), so a group takes 'oop'
    rows, or 'ip' where that is the only kind."""
    groups = defaultdict(list)
    for r in rows:
        if int(r["size"]) == 0:  # hccl-perf's row for a size that leaves a rank no element
            continue
        groups[(r["lib"], r["collective"], int(r["nranks"]), int(r["size"]), r["placement"])].append(r)
    out = {}
    for (lib, coll, n, size, pl), g in groups.items():
        if pl == "ip" and (lib, coll, n, size, "oop") in groups:
            continue
        times = [float(r["time_us"]) for r in g]
        t = statistics.median(times)
        algbw = size / t / 1e3 if t > 0 else 0.0
        out[(lib, coll, n, size)] = {
            "time_us": t,
            "busbw": algbw * busbw_factor(coll, n),
            "algbw": algbw,
            "reps": len(g),
            "spread": (max(times) - min(times)) / t if t > 0 else 0,
            "wrong": max(int(r["wrong"]) for r in g),
            "algo": g[0]["algo"],
        }
    return out


def limit_table(rows):
    """Median over repetitions per (limit, size) in GB/s."""
    g = defaultdict(list)
    for r in rows:
        g[(r["limit"], int(r["size"]))].append(float(r["gbps"]))
    return {k: statistics.median(v) for k, v in g.items()}


def limit_for(lims, kind, size, n, cores):
    """The machine's limit for a busbw at this size and rank count, GB/s.
    shm: the faster single-thread way to move `size` bytes (memcpy, or
    process_vm_readv out of another process); tcp: one loopback stream.
    Interpolated between the measured sizes (in log2 of the size; the end
    values beyond them), and shared when ranks outnumber cores: each rank
    must move busbw bytes per second and the cores copy for all of them, so
    min(1, cores/n) of it per rank."""
    names = ["memcpy", "cma"] if kind == "shm" else ["tcp"]
    pts = sorted((s, max(lims.get((l, s), 0) for l in names)) for s in {s for (l, s) in lims if l in names})
    if not pts:
        return None
    x = min(max(math.log2(size), math.log2(pts[0][0])), math.log2(pts[-1][0]))
    best = pts[-1][1]
    for (s0, v0), (s1, v1) in zip(pts, pts[1:]):
        x0, x1 = math.log2(s0), math.log2(s1)
        if x0 <= x <= x1:
            best = v0 + (v1 - v0) * (x - x0) / (x1 - x0)
            break
    return best * min(1.0, cores / n) if best > 0 else None


def best_of(med, peers, coll, n, size):
    cands = [(p, med[(p, coll, n, size)]) for p in peers if (p, coll, n, size) in med]
    if not cands:
        return None, None
    return min(cands, key=lambda c: c[1]["time_us"])


def ref_lib(kind):
    """hccl-tcp -> hccl-ref-tcp: the same run of hccl at BENCH_REF."""
    return kind.replace("hccl", "hccl-ref", 1)


def time_ratio(med, num, den):
    """med[num]'s time over med[den]'s, or None where either is missing."""
    a, b = med.get(num), med.get(den)
    return a["time_us"] / b["time_us"] if a and b and b["time_us"] > 0 else None


def ratio_tables(p, med, colls, nranks, kinds, ratio):
    """A table per collective: sizes down, (rank count, kind) across, ratio(kind, (coll, n,
    size)) in each cell. Returns every cell's (ratio, kind, coll, n, size)."""
    cells = []
    for coll in colls:
        p(f"### {coll}\n")
        hdr = ["size"] + [f"{n} ranks: {k}" for n in nranks for k in kinds]
        p("| " + " | ".join(hdr) + " |")
        p("|" + "---|" * len(hdr))
        for size in sorted({k[3] for k in med if k[1] == coll}):
            row = [human(size)]
            for n in nranks:
                for k in kinds:
                    r = ratio(k, (coll, n, size))
                    row.append("-" if r is None else f"{r:.2f}")
                    if r is not None:
                        cells.append((r, k, coll, n, size))
            p("| " + " | ".join(row) + " |")
        p("")
    return cells


def main():
    d = sys.argv[1]
    cores = int(sys.argv[2]) if len(sys.argv) > 2 else os.cpu_count()
    rows = read_csv(os.path.join(d, "results.csv"))
    med = medians(rows)
    lims = limit_table(read_csv(os.path.join(d, "limits.csv")))
    libs = [l for l in LIBS if any(k[0] == l for k in med)]
    colls = [c for c in COLLS if any(k[1] == c for k in med)]
    nranks = sorted({k[2] for k in med})

    with open(os.path.join(d, "medians.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["lib", "collective", "nranks", "size", "time_us", "algbw", "busbw", "reps", "spread", "wrong", "algo"])
        for k in sorted(med, key=lambda k: (COLLS.index(k[1]), k[2], LIBS.index(k[0]), k[3])):
            m = med[k]
            w.writerow([*k, f"{m['time_us']:.3f}", f"{m['algbw']:.4f}", f"{m['busbw']:.4f}", m["reps"],
                        f"{m['spread']:.2f}", m["wrong"], m["algo"]])

    md = []
    p = md.append
    p(f"# hccl against Open MPI, MPICH and Gloo: {os.path.basename(os.path.normpath(d))}\n")
    machine = open(os.path.join(d, "machine.txt")).read() if os.path.exists(os.path.join(d, "machine.txt")) else ""
    p("```\n" + machine.strip() + "\n```\n")
    p("Medians over the repetitions. **ratio** = hccl's busbw / the best peer's busbw at the same "
      "collective, size and rank count (= the peer's time / hccl's time): above 1 hccl is faster. "
      "`hccl` (shared memory) is set against the best of every peer, `hccl-tcp` against the best TCP "
      "peer (ompi-tcp, mpich-tcp, gloo). Out-of-place rows; broadcast is in place everywhere. "
      f"Below {human(SMALL)} the value columns are times in us (latency), from {human(SMALL)} busbw in GB/s. "
      f"**% of limit** (from {human(LARGE)}): hccl's busbw over what the machine allows at that size "
      "(shm: best of memcpy and process_vm_readv; tcp: one loopback stream; times min(1, cores/ranks)). "
      "See bench/README.md.\n")

    # ---- headline: ratios
    p("## hccl / best peer\n")
    pairs = [(lib, peers, name) for lib, peers, name in PAIRS if lib in libs]
    for coll in colls:
        p(f"### {coll}\n")
        hdr = ["size"]
        for n in nranks:
            hdr += [f"{n} ranks: {lib} / {name}" for lib, _, name in pairs]
        p("| " + " | ".join(hdr) + " |")
        p("|" + "---|" * len(hdr))
        for size in sorted({k[3] for k in med if k[1] == coll}):
            cells = [human(size)]
            for n in nranks:
                for lib, peers, _ in pairs:
                    m = med.get((lib, coll, n, size))
                    bp, bm = best_of(med, peers, coll, n, size)
                    if m is None or bm is None or m["time_us"] <= 0:
                        cells.append("-")
                    else:
                        cells.append(f"{bm['time_us'] / m['time_us']:.2f} ({bp})")
            p("| " + " | ".join(cells) + " |")
        p("")

    # ---- async against blocking, hccl's own
    if any(lib.endswith("-async") and lib.startswith("hccl") for lib in libs):
        p("## hccl: Async + hcclWait against the blocking call (time ratio, below 1.25 is the goal)\n")
        kinds = [k for k in ("hccl", "hccl-tcp") if k in libs and k + "-async" in libs]
        ratio_tables(p, med, colls, nranks, kinds,
                     lambda k, key: time_ratio(med, (k + "-async", *key), (k, *key)))

    # ---- hccl now against hccl at BENCH_REF
    ref_kinds = [k for k in REF_KINDS if k in libs and ref_lib(k) in libs]
    if ref_kinds:
        ref = next((line.split()[1] for line in machine.splitlines()
                    if line.startswith("hccl-ref:")), "BENCH_REF")
        p(f"## hccl now against hccl at {ref} (the reference's time / now's: above 1 now is faster)\n")
        cells = ratio_tables(p, med, colls, nranks, ref_kinds,
                             lambda k, key: time_ratio(med, (ref_lib(k), *key), (k, *key)))
        if cells:
            below = sorted(c for c in cells if c[0] < 0.95)
            p(f"At least 0.95: {len(cells) - len(below)} of {len(cells)} cells"
              + ("; below: " + ", ".join(f"{c} {n} ranks {human(s)} {k} {r:.2f}" for r, k, c, n, s in below)
                 if below else "") + ".\n")

    # ---- fraction of the limit
    p("## hccl busbw as % of the machine's limit\n")
    for coll in colls:
        p(f"### {coll}\n")
        hdr = ["size"] + [f"{n} ranks: {lib}" for n in nranks for lib in ("hccl", "hccl-tcp")]
        p("| " + " | ".join(hdr) + " |")
        p("|" + "---|" * len(hdr))
        for size in sorted({k[3] for k in med if k[1] == coll and k[3] >= LARGE}):
            cells = [human(size)]
            for n in nranks:
                for lib, kind in (("hccl", "shm"), ("hccl-tcp", "tcp")):
                    m = med.get((lib, coll, n, size))
                    lim = limit_for(lims, kind, size, n, cores)
                    cells.append("-" if m is None or not lim else
                                 f"{100 * m['busbw'] / lim:.0f}% of {fmt(lim, 2)}")
            p("| " + " | ".join(cells) + " |")
        p("")

    # ---- every library's value
    p("## Every library (busbw GB/s from 1K, time us below; `!` = wrong results)\n")
    for coll in colls:
        for n in nranks:
            sizes = sorted({k[3] for k in med if k[1] == coll and k[2] == n})
            if not sizes:
                continue
            p(f"### {coll}, {n} ranks\n")
            p("| size | " + " | ".join(libs) + " |")
            p("|" + "---|" * (len(libs) + 1))
            for size in sizes:
                cells = [human(size)]
                for lib in libs:
                    m = med.get((lib, coll, n, size))
                    if m is None:
                        cells.append("-")
                        continue
                    v = fmt(m["time_us"]) + " us" if size < SMALL else fmt(m["busbw"])
                    cells.append(v + ("!" if m["wrong"] else ""))
                p("| " + " | ".join(cells) + " |")
            p("")

    # ---- limits
    if lims:
        p("## Machine limits (GB/s, median of the repetitions' best-of-3)\n")
        kinds = ["memcpy", "cma", "tcp", "xcore"]
        p("| size | memcpy (1 thread) | process_vm_readv | TCP loopback | copy across two cores |")
        p("|---|---|---|---|---|")
        for size in sorted({s for (_, s) in lims}):
            p("| " + human(size) + " | " + " | ".join(fmt(lims.get((k, size))) if (k, size) in lims else "-"
                                                    for k in kinds) + " |")
        p("")

    # ---- in flight
    inf = read_csv(os.path.join(d, "inflight.csv"))
    if inf:
        p("## hccl: 8 allreduces of 1 MiB in flight (-N 8) against one at a time\n")
        p("busbw per allreduce (time of the batch / 8), GB/s, median over repetitions. One at a "
          "time either reuses one buffer set (-N 1: 2 MiB per rank, cache-resident) or cycles "
          "through the same 8 buffer sets as -N 8 (-N 8 -z 1: 16 MiB per rank), which isolates "
          "the cost of having several plans in flight from that of touching 8x the memory.\n")
        p("| ranks | -N 1 | -N 8 -z 1 (one at a time, 8 buffer sets) | -N 8 | -N 8 / -N 1 | -N 8 / -N 8 -z 1 |")
        p("|---|---|---|---|---|---|")
        g = defaultdict(list)
        for r in inf:
            g[(int(r["nranks"]), r["inflight"])].append(float(r["busbw"]))
        for n in sorted({k[0] for k in g}):
            a, b, c = (statistics.median(g[(n, k)]) if g.get((n, k)) else None for k in ("1", "8", "8seq"))
            p(f"| {n} | {fmt(a)} | {fmt(c)} | {fmt(b)} | {fmt(b / a) if a and b else '-'} | "
              f"{fmt(b / c) if b and c else '-'} |")
        p("")

    # ---- RSS
    rss = read_csv(os.path.join(d, "rss.csv"))
    if rss:
        p("## Peak RSS per rank, 8 ranks, 1 MiB allreduce (MiB; the benchmark's own buffers are 2 MiB)\n")
        p("| library | max over ranks | mean over ranks |")
        p("|---|---|---|")
        for r in sorted(rss, key=lambda r: LIBS.index(r["lib"]) if r["lib"] in LIBS else 99):
            p(f"| {r['lib']} | {int(r['rank_rss_max_kib']) / 1024:.1f} | {int(r['rank_rss_mean_kib']) / 1024:.1f} |")
        p("")

    # ---- runs: failures and noise
    runs = read_csv(os.path.join(d, "runs.csv"))
    if runs:
        wall = sum(float(r["wall_s"]) for r in runs)
        bad = [r for r in runs if r["rc"] != "0"]
        noisy = [r for r in runs if float(r["wall_s"]) > 0 and float(r["other_cpu_s"]) > 0.1 * float(r["wall_s"])]
        p("## Runs\n")
        p(f"{len(runs)} runs, {wall:.0f} s measured. Failed (non-zero exit; their rows, if any, are kept): "
          + (", ".join(f"{r['lib']} n={r['nranks']} rep {r['rep']} {r['what']} (rc {r['rc']})" for r in bad) or "none")
          + ".\n")
        p(f"Disturbed: {len(noisy)} of {len(runs)} runs, in which other processes used more than 10% of "
          "the run's wall time in CPU (their share in brackets): "
          + (", ".join(f"{r['lib']} n={r['nranks']} r{r['rep']}"
                       + ("" if r["what"] == "sweep" else f" {r['what']}")
                       + f" ({100 * float(r['other_cpu_s']) / float(r['wall_s']):.0f}%)"
                       for r in noisy) or "none") + ". Per-run detail: runs.csv.\n")
    with open(os.path.join(d, "table.md"), "w") as f:
        f.write("\n".join(md) + "\n")

    plot(d, med, lims, libs, colls, nranks, cores)


def plot(d, med, lims, libs, colls, nranks, cores):
    """One PNG per collective, a panel per rank count: busbw against size for
    every library, and the shm and tcp limits as dashed lines."""
    pd = os.path.join(d, "plots")
    os.makedirs(os.path.join(pd, "data"), exist_ok=True)
    lim_sizes = sorted({s for (_, s) in lims})
    for coll in colls:
        all_sizes = [k[3] for k in med if k[1] == coll]
        gp = [f"set terminal pngcairo size {600 * len(nranks)},480 font ',10'",
              f"set output '{pd}/{coll}.png'",
              "set datafile separator ','", "set datafile missing '?'",
              "set logscale x 2", "set logscale y 10", "set format y '%g'", "set grid",
              f"set xrange [{min(all_sizes)}:{max(all_sizes)}]",
              "set xlabel 'size (bytes)'", "set ylabel 'busbw (GB/s)'", "set key below maxrows 3 font ',9'",
              "set xtics (" + ", ".join(f"'{human(1 << e)}' {1 << e}" for e in range(3, 31, 3)) + ")",
              f"set multiplot layout 1,{len(nranks)} title '{coll}: busbw against size (median of repetitions)'"]
        for n in nranks:
            sizes = sorted({k[3] for k in med if k[1] == coll and k[2] == n})
            data = os.path.join(pd, "data", f"{coll}_n{n}.csv")
            with open(data, "w") as f:
                f.write("size," + ",".join(libs) + "\n")
                for s in sizes:
                    vals = [med.get((lib, coll, n, s)) for lib in libs]
                    f.write(f"{s}," + ",".join(f"{v['busbw']:.6g}" if v and v["busbw"] > 0 else "?" for v in vals) + "\n")
            ldata = os.path.join(pd, "data", f"limits_n{n}.csv")
            with open(ldata, "w") as f:
                for s in lim_sizes:
                    a, b = limit_for(lims, "shm", s, n, cores), limit_for(lims, "tcp", s, n, cores)
                    f.write(f"{s},{a or '?'},{b or '?'}\n")
            series = [f"'{data}' using 1:{i + 2} with linespoints lw 2 pt {i + 1} ps 0.7 title '{lib}'"
                      for i, lib in enumerate(libs)]
            if lim_sizes:
                series += [f"'{ldata}' using 1:2 with lines dt 2 lw 1.5 lc rgb 'black' title 'limit shm'",
                           f"'{ldata}' using 1:3 with lines dt 3 lw 1.5 lc rgb 'gray40' title 'limit tcp'"]
            gp += [f"set title '{n} ranks'", "plot " + ", ".join(series)]
        gp.append("unset multiplot")
        script = os.path.join(pd, "data", f"{coll}.gp")
        with open(script, "w") as f:
            f.write("\n".join(gp) + "\n")
        r = subprocess.run(["gnuplot", script], capture_output=True, text=True)
        if r.returncode != 0:
            print(f"gnuplot {script}: {r.stderr.strip()}", file=sys.stderr)


if __name__ == "__main__":
    main()
