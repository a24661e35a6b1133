"""Time the analyser and cost simulator for every algorithm at one rank count.

    python bench/simulate_speed.py [-p 1024] [-s 1M] [-a ring,rd]

Prints, per algorithm, the seconds spent building every rank's schedule,
flattening/matching them, and simulating (timed model and unit-cost rounds).
"""

import argparse
import time

from mlcomm.cli import parse_args
from mlcomm.commands import add_algorithms, positive_int, size


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-p", "--ranks", type=positive_int, default=1024)
    parser.add_argument("-s", "--size", type=size, default=1 << 20, help="bytes (default 1M)")
    add_algorithms(parser)
    args = parse_args(parser)

    from mlcomm.algorithms import build_schedules
    from mlcomm.analysis.metrics import analyzable, schedule_metrics
    from mlcomm.analysis.simulator import Network, compile_schedules, simulate

    names = args.algorithms or analyzable()
    # compile the event loop once outside the timings
    simulate(compile_schedules(build_schedules("ring", 2, 2), 8), Network())
    total = time.perf_counter()
    print(f"{'algorithm':28s} {'messages':>9s} {'build s':>8s} {'match s':>8s} {'sim s':>8s} {'rounds s':>8s}")
    for name in names:
        t0 = time.perf_counter()
        scheds = build_schedules(name, args.ranks, args.size // 8, 8)
        t1 = time.perf_counter()
        prog = compile_schedules(scheds, 8)
        del scheds
        t2 = time.perf_counter()
        simulate(prog, Network())
        t3 = time.perf_counter()
        schedule_metrics(prog)
        t4 = time.perf_counter()
        print(f"{name:28s} {prog.messages:9d} {t1 - t0:8.2f} {t2 - t1:8.2f} {t3 - t2:8.2f} {t4 - t3:8.2f}",
              flush=True)
    print(f"total {time.perf_counter() - total:.1f} s for p={args.ranks}, {args.size} bytes")


if __name__ == "__main__":
    from mlcomm.cli import abort_on_error
    abort_on_error(main)
