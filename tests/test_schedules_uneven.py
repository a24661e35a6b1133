"""The uneven all-gather and reduce-scatter schedules, proven exact by the local executor."""

import numpy as np
import pytest

from mlcomm.algorithms import COLLECTIVES, build_schedules
from mlcomm.ir.local import check_collective

UNEVEN = [("allgatherv", "ring"), ("allgatherv", "recursive_doubling"),
          ("allgatherv", "bruck"), ("reduce_scatter_v", "ring"),
          ("reduce_scatter_v", "pairwise")]
EVEN = {"allgatherv": "allgather", "reduce_scatter_v": "reduce_scatter"}


def _build(collective, name, counts, **options):
    """Every rank's schedule, rank r with its own count ``counts[r]``."""
    build = COLLECTIVES[collective][name].build
    return [build(r, len(counts), counts[r], 8, counts=counts, **options)
            for r in range(len(counts))]


def _cases(p, rng):
    """Random counts with zeros, all zeros, a single nonzero block, and blocks mostly empty."""
    lone = [0] * p
    lone[int(rng.integers(p))] = int(rng.integers(1, 12))
    sparse = [int(c) if rng.random() < 0.2 else 0 for c in rng.integers(1, 9, p)]
    return [tuple(int(c) for c in rng.integers(0, 9, p)), (0,) * p, tuple(lone), tuple(sparse)]


@pytest.mark.parametrize("collective,name", UNEVEN)
def test_uneven_schedules_exact_for_every_p(collective, name):
    """Exact for every p = 1..64 on random counts (zeros included), all-zero counts and a
    single nonzero block; the rings at every other p also cut into random segments."""
    rng = np.random.default_rng(51)
    segmented = "segment_bytes" in COLLECTIVES[collective][name].options
    for p in range(1, 65):
        for counts in _cases(p, rng):
            check_collective(_build(collective, name, counts), collective, counts=counts)
            if segmented and p % 2 and sum(counts):
                seg = 8 * int(rng.integers(1, max(counts) + 1))
                check_collective(_build(collective, name, counts, segment_bytes=seg),
                                 collective, counts=counts)


@pytest.mark.parametrize("collective,name", UNEVEN)
def test_even_counts_are_the_even_collective(collective, name):
    """On equal counts each schedule is its even form's, and exact as the even collective."""
    for p in (1, 2, 3, 5, 8, 13):
        for count in (0, 1, 7):
            counts = (count,) * p
            uneven = _build(collective, name, counts)
            assert uneven == build_schedules(name, p, count, collective=EVEN[collective])
            check_collective(uneven, EVEN[collective])


@pytest.mark.parametrize("collective,name", UNEVEN)
def test_bad_counts_are_refused(collective, name):
    """Missing counts, the wrong length, a negative or non-int entry, or counts[rank] unlike
    count: a ValueError naming counts."""
    build = COLLECTIVES[collective][name].build
    bad = [(None, "counts="), ([1, 2, 3], "counts="), ((1, 2), r"counts=\(1, 2\): give a tuple .* of 3"),
           ((1, 2, 3, 4), r"counts=\(1, 2, 3, 4\): give a tuple"), ((1, -2, 3), r"counts\[1\]=-2"),
           ((1, 2.0, 3), r"counts\[1\]=2.0"), ((1, True, 3), r"counts\[1\]=True"),
           ((1, 5, 3), r"counts\[1\]=5 but count=2")]
    for counts, match in bad:
        with pytest.raises(ValueError, match=match):
            build(1, 3, 2, 8, counts=counts)
    if "segment_bytes" in COLLECTIVES[collective][name].options:
        with pytest.raises(ValueError, match="segment_bytes=0"):
            build(1, 3, 2, 8, counts=(1, 2, 3), segment_bytes=0)


def test_costs_are_the_even_forms_on_the_largest_block():
    """The closed form is the even form's at the largest block, nbytes being the mean's."""
    for collective, name in UNEVEN:
        even = COLLECTIVES[EVEN[collective]][name].cost
        cost = COLLECTIVES[collective][name].cost
        args = (1e-6, 1e-9, 1e-10)
        assert cost(4, 800, *args, counts=(1, 3, 0, 0)) == pytest.approx(even(4, 2400, *args))
        assert cost(4, 800, *args, counts=(2,) * 4) == pytest.approx(even(4, 800, *args))
        assert cost(4, 800, *args, counts=(0,) * 4) == pytest.approx(even(4, 800, *args))
        assert cost(4, 800, *args) == pytest.approx(even(4, 800, *args))
