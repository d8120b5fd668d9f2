#!/usr/bin/env python3
"""Small dated baselines of compare.sh runs, and the diff of a run against one.

  baseline.py make OUT.csv RUN_DIR [RUN_DIR ...]
      For every hccl and hccl-tcp row (collective, nranks, size) of the runs'
      medians.csv: the median over the runs of hccl's time and busbw, and of the
      best peer's busbw at the same point (hccl against every peer, hccl-tcp
      against the TCP peers). A few KB: this is what stays in git.

  baseline.py diff BASELINE.csv RUN_DIR
      Markdown: for each point in both, hccl's busbw now / then, and the ratio to
      the best peer now and then. The ratio to the peers is the figure to read:
      the machine's noisy minutes move every library alike.
"""
import csv
import os
import statistics
import sys

TCP_PEERS = {"ompi-tcp", "mpich-tcp", "gloo"}
ALL_PEERS = {"ompi", "ompi-tcp", "mpich", "mpich-tcp", "gloo"}
FIELDS = ["lib", "collective", "nranks", "size", "time_us", "busbw", "peer_busbw", "peer"]


def read_medians(run_dir):
    with open(os.path.join(run_dir, "medians.csv"), newline="") as f:
        return list(csv.DictReader(f))


def points(rows):
    """(lib, collective, nranks, size) -> (time_us, busbw, best peer busbw, peer name)."""
    by_key = {}
    for r in rows:
        by_key[(r["lib"], r["collective"], int(r["nranks"]), int(r["size"]))] = r
    out = {}
    for (lib, coll, n, size), r in by_key.items():
        if lib not in ("hccl", "hccl-tcp") or int(r.get("wrong") or 0) > 0:
            continue
        peers = TCP_PEERS if lib == "hccl-tcp" else ALL_PEERS
        best, best_name = 0.0, ""
        for p in peers:
            pr = by_key.get((p, coll, n, size))
            if pr and int(pr.get("wrong") or 0) <= 0 and float(pr["busbw"]) > best:
                best, best_name = float(pr["busbw"]), p
        out[(lib, coll, n, size)] = (float(r["time_us"]), float(r["busbw"]), best, best_name)
    return out


def make(out_path, run_dirs):
    runs = [points(read_medians(d)) for d in run_dirs]
    keys = sorted(set().union(*runs), key=lambda k: (k[0], k[1], k[2], k[3]))
    with open(out_path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(FIELDS)
        for k in keys:
            vals = [r[k] for r in runs if k in r]
            peer = statistics.mode([v[3] for v in vals])
            w.writerow([*k,
                        "%.4g" % statistics.median(v[0] for v in vals),
                        "%.4g" % statistics.median(v[1] for v in vals),
                        "%.4g" % statistics.median(v[2] for v in vals), peer])


def read_baseline(path):
    with open(path, newline="") as f:
        return {(r["lib"], r["collective"], int(r["nranks"]), int(r["size"])):
                (float(r["time_us"]), float(r["busbw"]), float(r["peer_busbw"]), r["peer"])
                for r in csv.DictReader(f)}


def ratio(a, b):
    return a / b if b > 0 else float("nan")


def diff(base_path, run_dir):
    then = read_baseline(base_path)
    now = points(read_medians(run_dir))
    keys = sorted(set(then) & set(now))
    print("## Against the baseline %s\n" % os.path.basename(base_path))
    print("hccl busbw now / then, and hccl / best peer now and then (the peers run in the "
          "same minutes, so the second pair is the one to trust on a noisy machine).\n")
    print("| lib | collective | ranks | size | now / then | vs peer now | vs peer then |")
    print("|---|---|---|---|---|---|---|")
    worse = 0
    for k in keys:
        t, n = then[k], now[k]
        r_now, r_then = ratio(n[1], n[2]), ratio(t[1], t[2])
        if r_now < 0.95 * r_then:
            worse += 1
        print("| %s | %s | %d | %d | %.2f | %.2f | %.2f |" %
              (*k, ratio(n[1], t[1]), r_now, r_then))
    print("\n%d of %d points below 0.95x of the baseline's ratio to the best peer." %
          (worse, len(keys)))


def main():
    if len(sys.argv) >= 4 and sys.argv[1] == "make":
        make(sys.argv[2], sys.argv[3:])
    elif len(sys.argv) == 4 and sys.argv[1] == "diff":
        diff(sys.argv[2], sys.argv[3])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
