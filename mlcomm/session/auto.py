"""Which algorithm runs: explicit argument, then ``MLCOMM_ALGORITHM``, then ``auto``.

``auto`` takes the measured choice of ``mlcomm tune`` where the profile has one for
this number of ranks. Otherwise, for an all-reduce, it measures: the first call of a new
size (to the power of two) and element type times every candidate on buffers of that
size (at most :data:`TRIAL_BYTES`), and every later call in that band runs the fastest
(:func:`agreed_choice`), whatever its op, unless the op changes which loop reduces it or
whether the library can; below :data:`TRIAL_SHARED_BYTES` the band holds every integer
dtype of the size too (:func:`_band_key`). ``MLCOMM_AUTO=model`` (or a device buffer on
the direct path, or the other collectives) takes the cost model's prediction instead.
"""

from __future__ import annotations

import logging
import time

import numpy as np

from .. import config
from ..algorithms import ALGORITHMS, AUTO, COLLECTIVES, MPI_NATIVE, Layout, resolve, weighed
from ..ir.schedule import TURN_BYTES
from ..model.cost import auto_candidates, explain
from ..runtime.frame import compiled_supports
from ..transport.native import supports as library_supports

log = logging.getLogger("mlcomm")

__all__ = ["requested", "auto_choice", "agreed_choice", "auto_ran", "plan_for", "round_order",
           "round_period", "TRIAL_BYTES"]

#: a trial times a call of at most this many bytes (a larger call's band is judged by it)
TRIAL_BYTES = 16 << 20
#: what a trial may spend on a new size's first call: this many calls of its fastest
#: candidate, plus TRIAL_FLOOR seconds
TRIAL_STEADY = 10
TRIAL_FLOOR = 20e-3
#: rounds of timed blocks at most, and the shortest block worth timing (seconds); below
#: TRIAL_PROBE_BYTES at least TRIAL_MIN_ROUNDS run, budget or not (a round there costs
#: about a millisecond, and single calls of ranks that share cores are noisy)
TRIAL_ROUNDS = 5
TRIAL_MIN_ROUNDS = 2
TRIAL_BLOCK_SECONDS = 200e-6
#: a block of fewer calls than this follows one untimed call of its candidate, so that it
#: times a repeated call, as the benchmark does, not one on what another candidate's calls
#: left in the caches (at 2 MiB on 2 cores, P = 2, shared_memory's single copies take
#: 0.4-0.5 ms on their second call and 0.21 from the third; parameter_server 0.8-0.9 and
#: 0.7-0.8)
TRIAL_BLOCK_CALLS = 3
#: a candidate whose warm calls are this much slower than the fastest is not timed further
#: unless it is among the TRIAL_FINALISTS fastest or the model's favourite; one whose median
#: is this much slower than the best median leaves after its round
TRIAL_PRUNE = 1.5
TRIAL_DROP = 1.25
#: from this many bytes on, the candidates are first timed on a sixteenth of the size, each
#: the fastest of TRIAL_PROBE_CALLS calls (the window's algorithms alternate two sets of
#: areas, each slow on its first use: the third call is the first warm one); at most
#: TRIAL_FINALISTS of those within TRIAL_PROBE_PRUNE of the fastest go on to the full size
TRIAL_PROBE_BYTES = 1 << 20
TRIAL_PROBE_CALLS = 3
TRIAL_PROBE_PRUNE = 1.5
TRIAL_FINALISTS = 3
#: more of those within TRIAL_PROBE_PRUNE go on while the budget left after the probe holds
#: this many calls of each finalist at its probe time scaled to the size (its binding, its
#: first call and its warm one): a way's protocol can change between a sixteenth and the
#: whole (at 2 MiB and P = 4 on Intel MPI, ring took 104-127 us on 128 KiB against
#: recursive_halving_doubling's 78-86, and 0.81 ms on 2 MiB against 0.98)
TRIAL_FINALIST_CALLS = 3
#: the model's favourite goes on within this factor of the probe's fastest too: a probe
#: right after a barrier can misjudge (at P = 4 on 2 cores it timed shared_memory 1.2-1.9x
#: slower than ring at 1 MiB; at 16 MiB shared_memory is 1.4x faster), unless another form
#: of it goes on (the library's non-blocking and blocking calls are one call)
TRIAL_FAVOURITE_PRUNE = 2.0
#: the fastest of each way of moving data (:func:`_way`) goes on within this factor: the
#: library, the window and point-to-point messages each change protocol with the size (at
#: P = 2 on Intel MPI, point-to-point took 1.0 ms at 2 MiB against shared_memory's 0.22,
#: and about half of shared_memory's time at 128 KiB)
TRIAL_WAY_PRUNE = 3.0
#: each candidate's fastest of this many calls after its first stands for it (a first call
#: is mostly set-up); from TRIAL_PROBE_BYTES, of TRIAL_WARM_LARGE, and one more where the
#: budget left after the probe holds a call of each finalist (at 2 MiB and P = 4 on 2
#: cores a second call took 1.5-2.5x the steady one: 1.6-2.9 ms against 1.0)
TRIAL_WARM = 3
TRIAL_WARM_LARGE = 1
#: after a probe, a candidate whose first call takes this much longer than the fastest call
#: before it (in the model's order) is not called again: setting up adds less (at P = 4 and
#: 16 MiB on 2 cores, shared_memory's first calls took 9-13 ms, its second 8-10; the
#: library's 24-30 and 17-26, a quarter of the trial). The library's blocking call (the
#: call auto is never to lose to) that the probe timed within TRIAL_SETTLE of the fastest
#: is the exception: it goes on to the rounds however slow its first calls, where a library
#: sets up a new size over several calls (at 2 MiB and P = 2 on Intel MPI: 800-2200 us,
#: then 250-300, then 100 a call, where ring's take 150, 120 and 115; probed at 1.09-1.10
#: of the fastest, it was left out and auto ran ring, 1.13x the library's call). MPICH's at
#: 16 MiB, probed at 1.3-1.7 of the fastest, took 3x shared_memory's, its second call 17 ms
#: of a 70 ms budget
TRIAL_SLOW_FIRST = 2.0
#: the library's blocking call within this factor of the probe's fastest settles (above)
TRIAL_SETTLE = 1.2
#: from TRIAL_PROBE_BYTES, where the model's times are its bandwidth terms (bytes moved and
#: reduced, which the layout fixes), a candidate it predicts this much slower than its
#: favourite is not timed at all, the library's call apart (at P = 4 and 16 MiB on 2 cores
#: it predicted naive 3.7x, single_master 4.9x, and the probe timed them 2.3-2.6x and
#: 1.9-2.1x; at P = 16 it predicts 16x and 22x)
TRIAL_MODEL_PRUNE = 3.0
#: the trial times (or probes) of each way of moving data (:func:`_way`) the model's this
#: many fastest: within a way the model's order rests on step counts and bytes, which the
#: layout fixes, not on one transport's latency against another's (at P = 4 and 64 KiB on
#: 2 cores it ranks recursive_doubling, parameter_server and recursive_halving_doubling
#: first of the seven by messages, and they timed 70-91 us, the other four 77-104;
#: shared_memory 22-32)
TRIAL_WAY_TOP = 3
#: measured times within this factor of the fastest count as a tie (the model's order breaks it)
TRIAL_TIE = 1.02
#: a trial's pick holds for every op of its dtype that the same loop reduces and the library
#: can reduce or not alike (:func:`_band_key`): every candidate reduces about the same
#: elements, so an op's cost moves them alike (at P = 2, 256 KiB and 16 MiB, sum, max and
#: prod ranked shared_memory, ring, recursive_halving_doubling and naive alike); below this
#: many bytes, for every integer dtype of its size too, where a reduction costs a fraction
#: of a microsecond (8 KiB: 0.44-0.54 us, whichever op and dtype)
TRIAL_SHARED_BYTES = 8 << 10
#: a window variant (:data:`WINDOW_ONLY`) is chosen only where it times this much faster
#: than the fastest default: the window's gain is small where the cores share a cache, its
#: loss large where they do not, and a machine can move between the two within a job
#: (docs/performance.rst). The library's blocking call needs no margin: its time is the
#: library's own call's, which auto is never to lose to
VARIANT_MARGIN = 1.15


#: on one node ``hierarchical`` is a candidate below this many bytes only, where it runs
#: on the window's turn areas: above them its schedule rotates over areas of twice the
#: vector, which the trial pays to map and to pass over (at P = 4 and 64 KiB on 2 cores,
#: 6-11 ms of a 26-34 ms first call), and it timed no faster than ``shared_memory`` (P = 2
#: and 4, 2026-11-28: 32 KiB 4.2-4.3 us against 3.6-3.9 at P = 2, 27-41 against 26-34 at
#: P = 4; 64 KiB 7.0-7.5 against 5.6-5.9, and 35-66 against 39-55); from
#: ``single_copy_bytes`` its schedule is ``shared_memory``'s. Below it, at 8 KiB and
#: P = 2, it took 1.8-1.9 us against 2.1.
HIERARCHICAL_ONE_NODE_BYTES = TURN_BYTES

#: shared_memory's options that keep every size in the window
WINDOW_ONLY = (("single_copy_bytes", 1 << 62),)


def _window_variant(name):
    """``name`` (shared_memory, or hierarchical's intra-node phases) through the window where
    it would read its peers' buffers (from its ``single_copy_bytes`` up to
    :data:`TRIAL_PROBE_BYTES`): which is faster depends on whether the node's cores share a
    cache (docs/performance.rst). From TRIAL_PROBE_BYTES the trial's probe times it on a
    sixteenth of the size, which a cache holds where the whole may not be held: at 16 MiB
    the window timed up to 4x slower than reading peers' buffers, at 4 MiB faster."""
    least = ALGORITHMS[name].options["single_copy_bytes"]
    return lambda nbytes: [WINDOW_ONLY] if least <= nbytes < TRIAL_PROBE_BYTES else []


#: the library's blocking collective, timed beside its non-blocking one (which yields the
#: CPU while it waits and can report a stall)
BLOCKING = (("blocking", True),)

#: name -> (bytes -> option sets) that a trial times beside the name's defaults
VARIANTS = {"shared_memory": _window_variant("shared_memory"),
            "hierarchical": _window_variant("hierarchical"), MPI_NATIVE: lambda nbytes: [BLOCKING]}


def requested(algorithm, collective: str, default=None) -> str:
    """The canonical name asked for (maybe ``auto``); raise ValueError for unknown names.

    ``default`` (the communicator's agreed ``MLCOMM_ALGORITHM``) applies when ``algorithm``
    is None and the collective has an algorithm of that name; ``auto`` otherwise.
    """
    if algorithm is None:
        algorithm = default or AUTO
        if algorithm != AUTO and not _names(algorithm, collective):
            return AUTO  # MLCOMM_ALGORITHM names an algorithm this collective has not
    if collective != "allreduce" and algorithm == AUTO:
        return AUTO
    return resolve(algorithm, collective)


def _names(name, collective) -> bool:
    """Whether ``collective`` has an algorithm of that name or alias."""
    return any(name == a.name or name in a.aliases for a in COLLECTIVES[collective].values())


def auto_choice(collective: str, p: int, nbytes: int, *, dtype=None, op=None,
                itemsize: int = 4, nodes=None, device: bool = False) -> str:
    """The measured choice of ``mlcomm tune``, else the least predicted time, as NCCL's tuner picks.

    Each candidate's closed-form cost (:func:`mlcomm.model.cost.auto_candidates`: the
    algorithms whose registry entry is weighed on the node layout), plus the loop's per-step
    and per-op overhead and its local copies, is evaluated with the calibrated profile
    (``mlcomm calibrate``; built-in defaults without one). The other collectives take the
    node window's algorithm where it is weighed, else the first flat one. ``MLCOMM_DEBUG=1``
    logs the choice and every candidate's prediction.
    """
    if collective != "allreduce":  # the node window's where it is weighed, else a flat one
        names = weighed(Layout(p, nodes), device, collective)
        return next((name for name in names if COLLECTIVES[collective][name].context), names[0])
    choice, times, profile = explain(p, nbytes, dtype=dtype, op=op, itemsize=itemsize,
                                     nodes=nodes, device=device)
    _log_prediction(p, nbytes, choice, times, profile)
    return choice


def _log_prediction(p, nbytes, choice, times, profile):
    """Under ``MLCOMM_DEBUG=1``, log the choice and every candidate's prediction."""
    if config.debug():
        ranked = ", ".join(f"{n}={t * 1e6:.1f}us"
                           for n, t in sorted(times.items(), key=lambda kv: kv[1]))
        how = "tuned" if profile.tuned_choice(p, nbytes) == choice else "model"
        log.warning("mlcomm: auto p=%d bytes=%d -> %s (%s; profile: %s; %s)",
                    p, nbytes, choice, how, profile.model_source, ranked)


# --- auto on a communicator: agreed, and measured on first use ----------------------------------

def plan_for(session, collective, name, count, dtype, op, options, alias=None):
    """The plan of ``name`` (one of mlcomm's algorithms) for this call on ``session``, with
    the node layout it needs and hierarchical's ``inter`` chosen when not given."""
    context = COLLECTIVES[collective][name].context
    if options.get("intra") == "direct":  # hierarchical by messages: no window, no peer reads
        context = tuple(c for c in context if c != "single_copy")
    if context:
        options = dict(options, **session.context(context))
    if options.get("inter") == AUTO or (name == "hierarchical" and "inter" not in options):
        part = -(-count // max(map(len, session.nodes)))
        inter, _ = agreed_choice(session, collective, part, dtype, op, flat=True)
        options = dict(options, inter=inter)
    return session.plan(collective, name, count, dtype, op, options, alias)


def agreed_choice(session, collective, count, dtype, op, *, device=False,
                  flat=False, buffers=None) -> tuple:
    """``auto``'s algorithm and its options for this call on ``session``, the same on every
    rank.

    Collective on a size band's first call (a later count in the band takes the band's
    choice). There the ranks' calls are compared: a count, dtype, op or kind of buffer
    that differs from rank 0's raises ValueError on every rank
    (:meth:`~mlcomm.session.Session.agree`). Rank 0 proposes the tuned or modelled choice
    (:func:`auto_choice`), or for an all-reduce with neither a tuned choice nor
    ``MLCOMM_AUTO=model`` the candidates to time; every rank then runs the same trial
    (:func:`_trial`). The choice, modelled or timed, holds for the whole power-of-two size
    band. ``flat``: among the flat algorithms, for one rank per node (hierarchical's
    ``inter``). The options are empty but for a variant the trial timed
    (:data:`VARIANTS`). ``buffers``: the call's own ``(input, output)`` (one array where it
    is in place), which a trial runs on instead of arrays of its own (an output is written,
    an input only read; an in-place call's array is restored after the trial).
    """
    p = len(session.nodes) if flat else session.size
    key = (collective, p, count, dtype.str, op, device, flat)
    choice = session.choices.get(key)
    if choice is not None:
        return choice[0], dict(choice[1])
    band = (collective, p, *_band_key(count, dtype, op), device, flat)
    choice = session.choices.get(("band", *band)) or session.choices.get(("modelled", *band))
    if choice is None:
        proposal = None
        if session.rank == 0 or flat and p == 1:
            try:
                proposal = _propose(collective, p, count, dtype, op, session.nodes, device, flat)
            except ValueError as exc:  # e.g. a bad MLCOMM_AUTO: every rank raises it
                proposal = exc
        # one node's inter-node phase has one rank, where every flat algorithm is the same
        # copy: no rank need hear another's choice; elsewhere the agreement compares the
        # ranks' calls (a rank whose count, dtype or op differs would time another layout)
        agreed = proposal if flat and p == 1 else session.agree(
            proposal, f"{collective} ({count} x {dtype}): auto's choice for a new size "
                      f"(mlcomm's agreement)",
            (_FLAT_CALL if flat else _CALL,
             (collective, count, str(dtype), op, "device" if device else "host")))
        if isinstance(agreed, Exception):
            raise agreed
        choice, trial = agreed
        choice = (choice, ()) if choice is not None else \
            _trial(session, trial, count, dtype, op, buffers)
        # a band's later counts need no agreement, modelled or timed: a rank whose count
        # alone is new goes on to the call, whose checks name the difference, and does not
        # wait alone in an agreement
        session.remember_choice(("band" if trial else "modelled", *band), choice)
    session.remember_choice(key, choice)
    return choice[0], dict(choice[1])


#: what every rank's call must share where auto agrees on a new size band
_CALL = ("collective", "count", "dtype", "op", "buffers")
#: and where it agrees on hierarchical's inter-node algorithm, whose count is a part's
_FLAT_CALL = ("collective", "count of hierarchical's part across the nodes", "dtype", "op",
              "buffers")


def auto_ran(session, collective, count, dtype, op, *, device=False):
    """What ``auto`` runs for this call layout on ``session`` (the algorithm, and a variant's
    options in words), once a call has decided it; None before."""
    choice = session.choices.get((collective, session.size, count, dtype.str, op, device,
                                  False))
    return None if choice is None else _label(*choice)


def _propose(collective, p, count, dtype, op, nodes, device, flat):
    """Rank 0's ``(choice, None)``, or ``(None, trial)`` when the candidates are to be timed:
    ``trial`` is ``[(name, options), ...]`` in the model's order, ``options`` a tuple of
    items (a :data:`VARIANTS` entry, else empty): the model's :data:`TRIAL_WAY_TOP` fastest
    of each way (:func:`_way`), from :data:`TRIAL_PROBE_BYTES` of those it predicts within
    :data:`TRIAL_MODEL_PRUNE` of its favourite and the library's call."""
    mode, nbytes = config.auto_mode(), count * dtype.itemsize
    if collective != "allreduce" or flat or device or p == 1 or mode == "model":
        layout = tuple((r,) for r in range(p)) if flat else nodes
        return auto_choice(collective, p, nbytes, itemsize=dtype.itemsize, nodes=layout,
                           device=device), None
    names = auto_candidates(p, nodes)
    if "shared_memory" in names and nbytes < HIERARCHICAL_ONE_NODE_BYTES:
        names.append("hierarchical")  # on one node, the window's other schedule
    if library_supports(dtype, op):  # auto is never slower than the library's own call
        names.append(MPI_NATIVE)
    choice, times, profile = explain(p, nbytes, itemsize=dtype.itemsize, nodes=nodes,
                                     candidates=names)
    _log_prediction(p, nbytes, choice, times, profile)
    variants = lambda name: ((),) + tuple(VARIANTS.get(name, lambda _: ())(nbytes))
    ranked = sorted(times, key=times.get)
    if nbytes >= TRIAL_PROBE_BYTES:
        ranked = [name for name in ranked if name == MPI_NATIVE
                  or times[name] <= TRIAL_MODEL_PRUNE * times[ranked[0]]]
    ways = [_way(name) for name in ranked]
    ranked = [name for k, name in enumerate(ranked) if ways[:k].count(ways[k]) < TRIAL_WAY_TOP]
    if profile.tuned_choice(p, nbytes) == choice:
        if len(variants(choice)) == 1:
            return choice, None
        ranked = [choice]  # tune names the algorithm; which of its variants is timed here
    return None, [(name, options) for name in ranked for options in variants(name)]


def round_order(names, k) -> list:
    """Round ``k``'s order of interleaved timing, the same on every rank: row ``k`` of a
    Williams design, in which over a period every name follows every other equally often
    and takes every place (n rounds for n names, n even; 2n for n odd, each row then its
    reverse). A block pays for what the block before it left (at 64 KiB and P = 2 on 2
    cores, ``shared_memory`` after MPICH's ``MPI_Allreduce`` took 3-14 % more), and a
    shuffle seeded by the round put one candidate after it in 4 of 5 rounds and another
    in none (docs/performance.rst)."""
    n = len(names)
    first = [0] + [(i + 1) // 2 if i % 2 else n - i // 2 for i in range(1, n)]
    if n % 2 == 0:
        return [names[(f + k) % n] for f in first]
    row = [names[(f + k // 2) % n] for f in first]
    return row[::-1] if k % 2 else row


def round_period(n) -> int:
    """The rounds after which :func:`round_order` of ``n`` names repeats: the fewest over
    which every name follows every other equally often (n for n even, 2n for n odd, one
    for one name)."""
    return n if n % 2 == 0 or n == 1 else 2 * n


def _trial(session, trial, count, dtype, op, buffers=None) -> tuple:
    """Time the candidates on every rank; return the fastest as ``(name, options)``, the same
    on every rank (every decision below is taken on times reduced to the slowest rank's, and
    on the slowest rank's clock).

    The trial, set-up included, aims at a budget: :data:`TRIAL_STEADY` calls of its fastest
    candidate plus :data:`TRIAL_FLOOR` seconds. From :data:`TRIAL_PROBE_BYTES` on, the
    candidates are first timed on a sixteenth of the size (:func:`_probe`), which leaves the
    fastest of each way of moving data (:func:`_way`) within :data:`TRIAL_WAY_PRUNE` of the
    fastest, then the fastest of the rest up to :data:`TRIAL_FINALISTS` in all and more
    while the budget holds :data:`TRIAL_FINALIST_CALLS` full-size calls of each, the
    library's blocking call where it is within :data:`TRIAL_SETTLE` of the fastest, and the
    model's favourite, unless a form of it is among them (and none the model predicts
    :data:`TRIAL_MODEL_PRUNE` slower is probed). Each candidate left is bound at the full
    size; once the ranks are lined up, each is called once, then once on each other area of
    the window where it rotates (as often on every rank: a node of one rank does not rotate;
    a first pass over 32 areas of 64 KiB: 10-12 us a call, then 5.5), then
    :data:`TRIAL_WARM` times (after a probe :data:`TRIAL_WARM_LARGE` times, or once more
    where the budget holds it; neither where that first call took :data:`TRIAL_SLOW_FIRST`
    times the fastest call before it, unless it is the library's blocking call and the probe
    timed it within :data:`TRIAL_SETTLE` of the fastest), the fastest of those calls
    standing for it, the first included (setting up only adds to it); of those called
    again, the :data:`TRIAL_FINALISTS` fastest, those within :data:`TRIAL_PRUNE` of the
    fastest, such a library call and the model's favourite are then timed in rounds of
    interleaved blocks (a block lasts at least
    :data:`TRIAL_BLOCK_SECONDS`; one of fewer than :data:`TRIAL_BLOCK_CALLS` calls follows
    an untimed call), each round dropping those whose median is :data:`TRIAL_DROP` slower
    than the best, until one is left, the rounds are done or the budget, less the call to
    come (its binding and first call, or one call where the session keeps the trial's
    binding), would not hold another call of each (below TRIAL_PROBE_BYTES, after
    :data:`TRIAL_MIN_ROUNDS` rounds at least); the medians decide (:func:`trial_pick`), or
    the fastest calls where no round ran. An entry whose schedule is an earlier one's on
    every rank is not timed. What it timed is kept in ``session.trials`` by band. It runs on
    ``buffers`` (a call's input and output, or its one array in place) where given; there,
    at the full size, the session keeps the pick's binding as the call's
    (:meth:`~mlcomm.session.Session.keep_binding`).
    """
    session.wait_started()
    began = time.perf_counter()
    n = max(1, min(count, TRIAL_BYTES // dtype.itemsize))
    arena = _Arena(session, dtype, n, buffers)
    try:
        return _measure(session, trial, count, dtype, op, arena, n, began)
    finally:
        arena.restore()  # an in-place call's array, however the trial ended


def _measure(session, trial, count, dtype, op, arena, n, began) -> tuple:
    """The trial (:func:`_trial`) on ``arena``, begun at ``began``, timing calls of ``n``
    elements at most."""
    sync = lambda: session.watch.barrier(session.comm, "auto's trial", roll=False)
    probes = [n // 16] if n * dtype.itemsize >= TRIAL_PROBE_BYTES else []
    record = {"probes": [int(m) for m in probes], "probed": [], "first": {}, "warm": {},
              "warm_calls": 0, "calls": {}, "median": {}}
    spare, settled = False, set()  # the library's blocking call where it settles
    for m in probes:  # cheap calls on a smaller size thin out the candidates
        trial, plans = distinct_plans(session, trial, m, dtype, op, arena.alias)
        times, elapsed = _slowest(session, _probe(arena, [plans[entry] for entry in trial],
                                                  m, sync), began)
        record["probed"].append(dict(zip(map(_label_of, trial), times.tolist())))
        order = [i for i in np.argsort(times, kind="stable")
                 if times[i] <= TRIAL_WAY_PRUNE * times.min()]
        # each way of moving data changes its protocol with the size in its own way, which
        # a probe on a sixteenth does not see: the fastest of each goes on, then the
        # fastest of the rest
        ways, leaders = set(), []
        for i in order:
            way = _way(trial[i][0])
            if way not in ways:
                ways.add(way)
                leaders.append(i)
        rest = [i for i in order
                if i not in leaders and times[i] <= TRIAL_PROBE_PRUNE * times.min()]
        ranked = (leaders + rest)[:max(TRIAL_FINALISTS, len(leaders))]
        cost = TRIAL_FINALIST_CALLS * n / m * times  # each at the full size
        left = TRIAL_STEADY * n / m * times.min() + TRIAL_FLOOR - elapsed - cost[ranked].sum()
        for i in rest[len(ranked) - len(leaders):]:  # then as many more as the budget holds
            if cost[i] > left:
                break
            ranked.append(i)
            left -= cost[i]
        # the library's own call, probed close to the fastest, goes on and settles (below)
        settle = {i for i, entry in enumerate(trial) if entry == (MPI_NATIVE, BLOCKING)
                  and times[i] <= TRIAL_SETTLE * times.min()}
        ranked += sorted(settle - set(ranked))
        spare = bool(left >= n / m * times[ranked].sum())  # a second warm call of each
        if times[0] <= TRIAL_FAVOURITE_PRUNE * times.min() and \
                all(trial[i][0] != trial[0][0] for i in ranked):
            ranked.append(0)  # the model's favourite, unless a form of it goes on
        if len(ranked) == 1:
            return _decided(session, count, dtype, op, record, trial[ranked[0]], elapsed,
                            TRIAL_STEADY * n / m * times.min() + TRIAL_FLOOR)
        settled = {trial[i] for i in settle}
        trial = [trial[i] for i in sorted(ranked)]  # in the model's order still
    trial, plans = distinct_plans(session, trial, n, dtype, op, arena.alias)
    # the library's own call, where the probe found it close to the fastest: no first call
    # rules it out
    settling = {i for i, entry in enumerate(trial) if entry in settled}
    arena.reserve([plans[entry] for entry in trial], n)
    bindings, kept = {}, None
    try:
        # every candidate bound, then the ranks lined up once (each rank's set-up differs,
        # and a first call after its own would wait for the slowest rank's); each
        # candidate's first call, then its warm calls, the fastest of which judges
        warm = TRIAL_WARM_LARGE + spare if probes else TRIAL_WARM
        first, basis = np.full(len(trial), np.inf), np.full(len(trial), np.inf)
        setup = np.zeros(len(trial))
        for i, entry in enumerate(trial):
            start = time.perf_counter()
            bindings[i] = arena.bind(plans[entry], n)
            setup[i] = time.perf_counter() - start
        # the pass over the window's areas makes as many calls on every rank as where the
        # binding rotates most (a node of one rank has no window, and does not rotate);
        # agreeing on it lines the ranks up
        passes = _everywhere(session, np.array([bindings[i].rotations - 1
                                                for i in range(len(trial))], np.int64))
        for i in range(len(trial)):
            first[i] = _timed(bindings[i].run)
            if probes:  # the slowest rank's, as are the calls before: every rank skips alike
                first[:i + 1], basis[:i] = np.split(_slowest(
                    session, np.concatenate([first[:i + 1], basis[:i]]), began)[0], [i + 1])
                if i not in settling and first[i] >= TRIAL_SLOW_FIRST * np.minimum(
                        first[:i], basis[:i]).min(initial=np.inf):
                    continue
            for _ in range(passes[i]):  # each area once: the first is slow
                bindings[i].run()
            basis[i] = min(_timed(bindings[i].run) for _ in range(warm))
        both, elapsed = _slowest(session, np.concatenate([first, basis, setup]), began)
        first, warmed, setup = np.split(both, 3)
        # setting up only adds to a first call: where it was the faster, it stands
        basis = np.minimum(first, warmed)
        budget = TRIAL_STEADY * basis.min() + TRIAL_FLOOR
        # the call after the trial runs its pick, on this binding where the trial ran on
        # the call's own buffers (the session keeps it), else bound anew: the rounds leave
        # it that much
        ranked = np.argsort(basis, kind="stable")
        keeps = arena.calls and n == count
        coming = basis[ranked[0]] if keeps else setup[ranked[0]] + first[ranked[0]]
        # and the model's favourite (first): single calls of ranks that share cores are
        # noise (P = 4 on 2 cores, 8 B: shared_memory's fastest of four took 14-74 us, its
        # rounds' median 8, and it was left out in 2 of 4 trials); and the library's calls
        # still settling
        alive = sorted({0} | settling | {
            i for k, i in enumerate(ranked) if warmed[i] < np.inf and (
                k < TRIAL_FINALISTS or basis[i] <= TRIAL_PRUNE * basis.min())})
        samples = {i: [] for i in alive}
        estimate = basis.copy()
        calls = np.zeros(len(trial), np.int64)
        for r in range(TRIAL_ROUNDS):
            # a call of each, and the untimed call before a short block
            one_each = sum(estimate[i] * (1 + (estimate[i] * TRIAL_BLOCK_CALLS
                                               > TRIAL_BLOCK_SECONDS)) for i in alive)
            left = budget - coming - elapsed
            if len(alive) == 1 or left < one_each and (probes or r >= TRIAL_MIN_ROUNDS):
                break
            block = max(TRIAL_BLOCK_SECONDS, left / (TRIAL_ROUNDS - r) / len(alive))
            block = max(TRIAL_BLOCK_SECONDS, min(block, left / len(alive)))
            times = np.zeros(len(trial))
            counts = {i: max(1, int(block // estimate[i])) for i in alive}
            for i in round_order(alive, r):  # interleaved: drift hits them all
                sync()
                if counts[i] < TRIAL_BLOCK_CALLS:
                    bindings[i].run()
                start = time.perf_counter()
                for _ in range(counts[i]):
                    bindings[i].run()
                times[i] = (time.perf_counter() - start) / counts[i]
            times, elapsed = _slowest(session, times, began)
            for i in alive:
                samples[i].append(times[i])
                estimate[i] = float(np.median(samples[i]))
                calls[i] += counts[i]
            best = min(estimate[i] for i in alive)
            alive = [i for i in alive if estimate[i] <= TRIAL_DROP * best]
        pick = alive[trial_pick([trial[i][1] for i in alive], [estimate[i] for i in alive])]
        kept = bindings.pop(pick) if keeps else None
    finally:
        for binding in bindings.values():
            binding.free()
    if kept is not None and not session.keep_binding(kept, arena.scratch.nbytes):
        kept.free()
    labels = [_label_of(entry) for entry in trial]
    record.update(first=dict(zip(labels, first.tolist())), warm_calls=warm,
                  warm={label: t for label, t in zip(labels, warmed.tolist()) if t < np.inf},
                  calls=dict(zip(labels, calls.tolist())),
                  median={labels[i]: estimate[i] for i in range(len(trial)) if calls[i]})
    if session.rank == 0 and config.debug():
        ranked = ", ".join(f"{labels[i]}={estimate[i] * 1e6:.1f}us"
                           for i in sorted(range(len(trial)), key=lambda i: estimate[i]))
        log.warning("mlcomm: auto p=%d bytes=%d -> %s (measured on %d bytes; %s)",
                    session.size, count * dtype.itemsize, labels[pick],
                    n * dtype.itemsize, ranked)
    return _decided(session, count, dtype, op, record, trial[pick], elapsed, budget)


def _decided(session, count, dtype, op, record, pick, elapsed, budget) -> tuple:
    """Keep the trial's ``record`` in ``session.trials`` with its pick, the seconds it
    spent and its budget; return ``pick``."""
    session.remember_trial(_band_key(count, dtype, op), dict(
        record, spent=elapsed, budget=float(budget), pick=_label_of(pick)))
    return pick


class _Arena:
    """The trial's buffers, which its candidates share (they run one at a time): input and
    output, the call's own where given (``buffers``; one array in place, whose first ``n``
    elements :meth:`restore` puts back), else written as a caller's are (pages never
    written all map the kernel's zero page, and single-copy reads of it are slower than of
    written pages), and scratch, written once; each grows to the largest call bound to it
    so far, and a call of ``m`` elements runs on their first ``m``."""

    def __init__(self, session, dtype, n, buffers=None):
        self.session = session
        self.inp = self.out = self.scratch = np.zeros(0, dtype)
        #: whether it runs on the call's own buffers; the plans' alias (0: in place)
        self.calls, self.alias, self._saved = buffers is not None, None, None
        if self.calls:  # at 16 MiB, writing arrays of its own took 5-12 ms a rank
            self.inp, self.out = buffers
            if np.may_share_memory(self.inp, self.out):
                self.alias, self._saved = 0, self.out[:n].copy()
            else:
                # written once, so that no candidate's first call pays the page faults of
                # a fresh output (at 16 MiB and P = 4 on 2 cores, shared_memory's, which
                # writes its peers' outputs, took 20-42 ms against 10 for its second)
                self.out.fill(0)

    def restore(self):
        """Put an in-place call's data back, which the candidates' calls overwrote."""
        if self._saved is not None:
            self.out[:self._saved.size] = self._saved

    def reserve(self, plans, m):
        """Room for calls of ``m`` elements of ``plans``, touched, as a repeated call finds
        it."""
        if m > self.inp.size:
            self.inp, self.out = np.ones(m, self.inp.dtype), np.ones(m, self.inp.dtype)
        need = max((plan.program.counts[2] for plan in plans), default=0)
        if need > self.scratch.size:
            self.scratch = np.empty(need, self.scratch.dtype)
            self.scratch[...] = 0

    def bind(self, plan, m):
        """``plan`` bound to the arena's first ``m`` elements (freed by the caller)."""
        self.reserve([plan], m)
        return self.session.own_binding(plan, self.inp[:m], self.out[:m],
                                        self.scratch[:plan.program.counts[2]])


def _probe(arena, plans, m, sync) -> np.ndarray:
    """Each plan's time on ``m`` elements of ``arena``, the fastest of
    :data:`TRIAL_PROBE_CALLS` (this rank's)."""
    arena.reserve(plans, m)
    times = np.full(len(plans), np.inf)
    for i, plan in enumerate(plans):
        binding = arena.bind(plan, m)
        try:
            sync()
            times[i] = min(_timed(binding.run) for _ in range(TRIAL_PROBE_CALLS))
        finally:
            binding.free()
    return times


def _timed(run) -> float:
    """The seconds one ``run()`` takes."""
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def _everywhere(session, values, largest=True):
    """``values`` (an array, reduced in place) the largest (else the smallest) over the
    ranks, the same on every rank: a collective wait, watched as the trial's."""
    from mpi4py import MPI
    op = MPI.MAX if largest else MPI.MIN
    session.watch.wait(lambda: session.comm.Iallreduce(MPI.IN_PLACE, values, op=op),
                       "auto's trial", roll=False)
    return values


def _slowest(session, times, began) -> tuple:
    """``(times, elapsed)``: ``times`` reduced to the slowest rank's, and the seconds since
    ``began`` on the slowest rank, the same on every rank."""
    both = _everywhere(session, np.append(times, time.perf_counter() - began))
    return both[:-1], float(both[-1])


def _band_key(count, dtype, op) -> tuple:
    """The key of an all-reduce's size band in ``session.trials``, and of the choice its
    trial made: the power of two of its bytes, with only what can change the pick: the
    dtype (below :data:`TRIAL_SHARED_BYTES`, for integers and bool only their size; a
    float's kernel may convert each element: float16 and bfloat16 through float32), whether
    the compiled loop reduces the pair (the Python loop's steps cost microseconds) and
    whether the library's ``MPI_Allreduce`` is a candidate. The op is not in it."""
    nbytes = count * dtype.itemsize
    small = nbytes < TRIAL_SHARED_BYTES and dtype.kind in "iub"
    return nbytes.bit_length(), dtype.itemsize if small else dtype.str, \
        compiled_supports(dtype, op), library_supports(dtype, op)


def _way(name) -> str:
    """How candidate ``name`` moves data: the library's own collective, the node's shared
    window, or point-to-point messages."""
    if name == MPI_NATIVE:
        return "library"
    return "window" if ALGORITHMS[name].window else "messages"


def _label_of(entry) -> str:
    return _label(*entry)


def trial_pick(options, typical) -> int:
    """The index of the trial's choice among entries with these ``options`` and median
    times: the fastest, a window variant's time counted :data:`VARIANT_MARGIN` times over;
    the first (the model's favourite) of those within :data:`TRIAL_TIE` of it."""
    judged = np.asarray(typical) * [VARIANT_MARGIN if o == WINDOW_ONLY else 1.0
                                    for o in options]
    return int(np.argmax(judged <= judged.min() * TRIAL_TIE))


def distinct_plans(session, trial, count, dtype, op, alias=None):
    """``(trial, plans)``: the trial's entries less those whose schedule is an earlier
    entry's on every rank (a window variant where the node refuses single-copy reads), and
    each entry's plan for ``count`` elements (in place where ``alias`` is 0), keyed by
    ``(name, options)``."""
    plans = {(name, options): plan_for(session, "allreduce", name, count, dtype, op,
                                       dict(options), alias)
             for name, options in trial}
    schedules = [plans[name, options].schedule for name, options in trial]
    same = _everywhere(session, np.array(
        [[j < i and schedules[i] == schedules[j] for j in range(len(trial))]
         for i in range(len(trial))], np.int32), largest=False)
    return [t for t, row in zip(trial, same) if not row.any()], plans


def _label(name, options):
    return name + (" (window only)" if options == WINDOW_ONLY else
                   " (blocking)" if options == BLOCKING else
                   "".join(f" {k}={v}" for k, v in options))
