"""What is asked (:func:`requested`), the candidates of a trial and the model's choice.

:func:`auto_choice` takes the measured choice of ``mlcomm tune``, else the cost model's
prediction; :func:`_propose` is rank 0's proposal for a call: that choice, or the candidates
to time, with the variants (:data:`VARIANTS`) each is timed in. :func:`_band_key` is what a
choice holds for.
"""

from __future__ import annotations

import logging

from ... import config
from ...algorithms import ALGORITHMS, AUTO, COLLECTIVES, MPI_NATIVE, Layout, resolve, weighed
from ...model.cost import auto_candidates, explain
from ...model.machine import load_profile
from ...runtime.frame import compiled_supports
from ...transport.native import native_dtype_ok, supports as library_supports
from . import tuning

log = logging.getLogger("mlcomm")

#: shared_memory's options that keep every size in the window
WINDOW_ONLY = (("single_copy_bytes", 1 << 62),)

#: the library's blocking collective, timed beside its non-blocking one (which yields the
#: CPU while it waits and can report a stall)
BLOCKING = (("blocking", True),)


def _window_variant(name):
    """``name`` (shared_memory, or hierarchical's intra-node phases) through the window where
    it would read its peers' buffers (from its ``single_copy_bytes`` up to
    :data:`~.tuning.TRIAL_PROBE_BYTES`): which is faster depends on whether the node's cores
    share a cache (docs/performance.rst). From TRIAL_PROBE_BYTES the trial's probe would
    time it on a sixteenth of the size, which a cache holds where the whole may not be
    (docs/tuning.rst)."""
    least = ALGORITHMS[name].options["single_copy_bytes"]
    return lambda nbytes: [WINDOW_ONLY] if least <= nbytes < tuning.TRIAL_PROBE_BYTES else []


#: the collectives other than all-reduce that reduce (the others move data only)
REDUCING = frozenset(("reduce_scatter", "reduce", "reduce_scatter_v"))

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
    (``mlcomm calibrate``; built-in defaults without one). The other collectives' model
    takes the algorithm of least closed-form cost, the node window's among them on one
    node (:func:`_other_choice`). ``MLCOMM_DEBUG=1``
    logs the choice and every candidate's prediction.
    """
    if collective != "allreduce":
        return _other_choice(collective, p, nbytes, dtype, op, nodes, device)
    choice, times, profile = explain(p, nbytes, dtype=dtype, op=op, itemsize=itemsize,
                                     nodes=nodes, device=device)
    _log_prediction(p, nbytes, choice, times, profile)
    return choice


def _other_choice(collective, p, nbytes, dtype, op, nodes, device) -> str:
    """A collective other than all-reduce: of the algorithms weighed on the layout (the node
    window's among them on one node), the one of least closed-form cost for ``nbytes`` (the
    count the schedule takes, in bytes: a rank's block) on the profile's alpha, beta and
    gamma, the first registered of equals; the library's own call where none is weighed."""
    names, times, profile = _other_times(collective, p, nbytes, dtype, op, nodes, device)
    if not names:
        return MPI_NATIVE
    choice = min(names, key=lambda name: round(times[name], 15))
    _log_prediction(p, nbytes, choice, times, profile)
    return choice


def _other_times(collective, p, nbytes, dtype, op, nodes, device) -> tuple:
    """``(names, times, profile)``: the algorithms of ``collective`` weighed on the layout,
    in registry order, and each one's closed-form seconds for ``nbytes``."""
    table = COLLECTIVES[collective]
    names = weighed(Layout(p, nodes), device, collective)
    profile = load_profile()
    gamma = profile.gamma_for(dtype, op)
    context = lambda name: {k: v for k, v in (("nodes", nodes),) if k in table[name].context}
    times = {name: table[name].cost(p, nbytes, profile.alpha, profile.beta, gamma,
                                    **dict(table[name].options, **context(name)))
             for name in names}
    return names, times, profile


def _other_candidates(collective, p, nbytes, dtype, op, nodes) -> list:
    """The candidates of a collective other than all-reduce that its trial times
    (:mod:`.others`), as ``[(name, ()), ...]``: the model's
    :data:`~.tuning.OTHER_MODEL_TOP` cheapest by closed form, the first registered of
    equals first, then the node window's (``shared_memory``) where it is weighed, then the
    library's own call where the library has the dtype (and the op, for a reduction)."""
    names, times, _ = _other_times(collective, p, nbytes, dtype, op, nodes, False)
    ranked = sorted(names, key=lambda name: round(times[name], 15))[:tuning.OTHER_MODEL_TOP]
    if "shared_memory" in names and "shared_memory" not in ranked:
        ranked.append("shared_memory")
    if library_supports(dtype, op) if collective in REDUCING else native_dtype_ok(dtype):
        ranked.append(MPI_NATIVE)
    return [(name, ()) for name in ranked]


def _log_prediction(p, nbytes, choice, times, profile):
    """Under ``MLCOMM_DEBUG=1``, log the choice and every candidate's prediction."""
    if config.debug():
        ranked = ", ".join(f"{n}={t * 1e6:.1f}us"
                           for n, t in sorted(times.items(), key=lambda kv: kv[1]))
        how = "tuned" if profile.tuned_choice(p, nbytes) == choice else "model"
        log.warning("mlcomm: auto p=%d bytes=%d -> %s (%s; profile: %s; %s)",
                    p, nbytes, choice, how, profile.model_source, ranked)


def _propose(collective, p, count, dtype, op, nodes, device, flat):
    """Rank 0's ``(choice, None)``, or ``(None, trial)`` when the candidates are to be timed:
    ``trial`` is ``[(name, options), ...]`` in the model's order, ``options`` a tuple of
    items (a :data:`VARIANTS` entry, else empty): the model's
    :data:`~.tuning.TRIAL_WAY_TOP` fastest of each way (:func:`_way`), from
    :data:`~.tuning.TRIAL_PROBE_BYTES` of those it predicts within
    :data:`~.tuning.TRIAL_MODEL_PRUNE` of its favourite and the library's call. Another
    collective's are :func:`_other_candidates`, but where its count is 0 (an uneven form
    whose counts differ by rank: every count would share one band), which the model
    decides."""
    mode, nbytes = config.auto_mode(), count * dtype.itemsize
    if collective != "allreduce" and not (flat or device or p == 1 or mode == "model"
                                          or count == 0):
        # timed (:mod:`.others`); an uneven form whose counts differ by rank has count 0
        return None, _other_candidates(collective, p, nbytes, dtype, op, nodes)
    if collective != "allreduce" or flat or device or p == 1 or mode == "model":
        layout = tuple((r,) for r in range(p)) if flat else nodes
        return auto_choice(collective, p, nbytes, itemsize=dtype.itemsize, nodes=layout,
                           device=device), None
    names = auto_candidates(p, nodes)
    if "shared_memory" in names and nbytes < tuning.HIERARCHICAL_ONE_NODE_BYTES:
        names.append("hierarchical")  # on one node, the window's other schedule
    if library_supports(dtype, op):  # auto is never slower than the library's own call
        names.append(MPI_NATIVE)
    choice, times, profile = explain(p, nbytes, itemsize=dtype.itemsize, nodes=nodes,
                                     candidates=names)
    _log_prediction(p, nbytes, choice, times, profile)
    variants = lambda name: ((),) + tuple(VARIANTS.get(name, lambda _: ())(nbytes))
    ranked = sorted(times, key=times.get)
    if nbytes >= tuning.TRIAL_PROBE_BYTES:
        ranked = [name for name in ranked if name == MPI_NATIVE
                  or times[name] <= tuning.TRIAL_MODEL_PRUNE * times[ranked[0]]]
    ways = [_way(name) for name in ranked]
    ranked = [name for k, name in enumerate(ranked)
              if ways[:k].count(ways[k]) < tuning.TRIAL_WAY_TOP]
    if profile.tuned_choice(p, nbytes) == choice:
        if len(variants(choice)) == 1:
            return choice, None
        ranked = [choice]  # tune names the algorithm; which of its variants is timed here
    return None, [(name, options) for name in ranked for options in variants(name)]


def _way(name) -> str:
    """How candidate ``name`` moves data: the library's own collective, the node's shared
    window, or point-to-point messages."""
    if name == MPI_NATIVE:
        return "library"
    return "window" if ALGORITHMS[name].window else "messages"


def _band_key(count, dtype, op) -> tuple:
    """The key of an all-reduce's size band in ``session.trials``, and of the choice its
    trial made: the power of two of its bytes, with only what can change the pick: the
    dtype (below :data:`~.tuning.TRIAL_SHARED_BYTES`, for integers and bool only their
    size; a float's kernel may convert each element: float16 and bfloat16 through float32),
    whether the compiled loop reduces the pair (the Python loop's steps cost microseconds)
    and whether the library's ``MPI_Allreduce`` is a candidate. The op is not in it."""
    nbytes = count * dtype.itemsize
    small = nbytes < tuning.TRIAL_SHARED_BYTES and dtype.kind in "iub"
    return nbytes.bit_length(), dtype.itemsize if small else dtype.str, \
        compiled_supports(dtype, op), library_supports(dtype, op)


def _label(name, options) -> str:
    """A candidate in words: its name, and a variant's options."""
    return name + (" (window only)" if options == WINDOW_ONLY else
                   " (blocking)" if options == BLOCKING else
                   "".join(f" {k}={v}" for k, v in options))


def _label_of(entry) -> str:
    return _label(*entry)
