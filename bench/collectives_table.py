"""The table of bench/collectives_mpis.sh's jobs for P ranks: per collective and size, on each
MPI, the median over the runs of its own call (µs), mlcomm's best hand-written algorithm over
the fastest of the three MPIs' own calls, and ``auto`` over the better of that best and this
MPI's own call.

    python bench/collectives_table.py 2
"""
import json, os, statistics as st, sys
P = int(sys.argv[1])
OUT = os.environ.get("OUT", os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "collectives"))
MPIS = ("mpich", "openmpi", "impi")
COLL = ("gather", "scatter", "alltoall", "allgather", "reduce_scatter", "bcast", "reduce")
SIZES = {8: "8 B", 65536: "64 KiB", 16777216: "16 MiB"}
t = {}  # (mpi, coll, bytes, alg) -> [us per run]
ran = {}
for m in MPIS:
    for c in COLL:
        for run in (1, 2, 3):
            try:
                rows = json.load(open(os.path.join(OUT, f"{m}.{c}.p{P}.{run}.json")))
            except FileNotFoundError:
                continue
            for r in rows:
                alg = "auto" if r["algorithm"].startswith("auto") else r["algorithm"]
                t.setdefault((m, c, r["bytes"], alg), []).append(r["time_us_avg"])
                if alg == "auto":
                    ran.setdefault((m, c, r["bytes"]), []).append(r.get("ran") or r["algorithm"])
med = {k: st.median(v) for k, v in t.items()}
out = []
worst_auto = worst_best = 0
for c in COLL:
    for b, label in SIZES.items():
        libs = {m: med.get((m, c, b, "mpi")) for m in MPIS}
        if None in libs.values():
            continue
        fastest_lib = min(libs.values())
        cells = []
        for m in MPIS:
            algs = {a: v for (mm, cc, bb, a), v in med.items() if mm == m and cc == c and bb == b and a not in ("mpi", "auto")}
            best_alg = min(algs, key=algs.get)
            best = algs[best_alg]
            auto = med[(m, c, b, "auto")]
            a_ratio = auto / min(best, libs[m])
            b_ratio = best / fastest_lib
            worst_auto, worst_best = max(worst_auto, a_ratio), max(worst_best, b_ratio)
            cells.append(f"{libs[m]:.1f} / {best_alg} {b_ratio:.2f} / {a_ratio:.2f}")
        out.append((c, label, cells))
w = [16, 8] + [40] * 3
line = "  ".join("=" * x for x in w)
print(line)
print("  ".join(h.ljust(x) for h, x in zip(["collective", "size", "MPICH", "Open MPI", "Intel MPI"], w)).rstrip())
print(line)
for c, label, cells in out:
    print("  ".join(s.ljust(x) for s, x in zip([c, label, *cells], w)).rstrip())
print(line)
print(f"# worst auto/min(best, own mpi) {worst_auto:.2f}; worst best/fastest mpi {worst_best:.2f}", file=sys.stderr)
