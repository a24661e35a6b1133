"""Time the analyser and cost simulator for every algorithm at one rank count.

    python bench/simulate_speed.py [-p 1024] [-s 1M] [-a ring,rd] [--ranks-per-node 8]

Prints, per algorithm, the seconds spent building every rank's schedule,
flattening/matching them, and simulating (timed model and unit-cost rounds).
``--ranks-per-node K`` lays the ranks out on nodes of K (the node-aware
algorithms' layout and the two-level model, inter-node alpha = 5 us and
beta = 1e-10 s/B); without it every rank is on one node.

    python bench/simulate_speed.py -p 4096 -s 16M -a hierarchical --ranks-per-node 8
"""

import argparse
import time

from mlcomm.cli import parse_args
from mlcomm.cli.args import add_algorithms, positive_int, size


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-p", "--ranks", type=positive_int, default=1024)
    parser.add_argument("-s", "--size", type=size, default=1 << 20, help="bytes (default 1M)")
    parser.add_argument("--ranks-per-node", type=positive_int, default=None, metavar="K",
                        help="K consecutive ranks per node (default: one node)")
    add_algorithms(parser)
    args = parse_args(parser)

    from mlcomm.algorithms import build_schedules
    from mlcomm.analysis.metrics import analyzable, build_options, not_applicable, schedule_metrics
    from mlcomm.analysis.simulator import Network, compile_schedules, simulate

    k = args.ranks_per_node
    net = Network(ranks_per_node=k, inter_alpha=5e-6, inter_beta=1e-10) if k else Network()
    names = [n for n in args.algorithms or analyzable() if not not_applicable(n, args.ranks, k)]
    # compile the event loop once outside the timings
    simulate(compile_schedules(build_schedules("ring", 2, 2), 8), Network())
    total = time.perf_counter()
    print(f"{'algorithm':28s} {'messages':>9s} {'build s':>8s} {'match s':>8s} {'sim s':>8s} {'rounds s':>8s}")
    for name in names:
        opts = build_options(name, args.ranks, args.size, options={}, ranks_per_node=k,
                             network=net)
        t0 = time.perf_counter()
        scheds = build_schedules(name, args.ranks, args.size // 8, 8, **opts)
        t1 = time.perf_counter()
        prog = compile_schedules(scheds, 8)
        del scheds
        t2 = time.perf_counter()
        simulate(prog, net)
        t3 = time.perf_counter()
        schedule_metrics(prog)
        t4 = time.perf_counter()
        print(f"{name:28s} {prog.messages:9d} {t1 - t0:8.2f} {t2 - t1:8.2f} {t3 - t2:8.2f} {t4 - t3:8.2f}",
              flush=True)
    print(f"total {time.perf_counter() - total:.1f} s for p={args.ranks}, {args.size} bytes"
          + (f", {k} ranks per node" if k else ""))


if __name__ == "__main__":
    from mlcomm.cli import abort_on_error
    abort_on_error(main)
