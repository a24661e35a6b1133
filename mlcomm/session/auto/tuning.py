"""auto's tuning: every constant of its candidates and its trial, with what it governs.

Modules read them as ``tuning.NAME`` at call time, so a test can set one for a call.
docs/tuning.rst gives what was measured to set each.
"""

from ...ir.schedule import TURN_BYTES as _TURN_BYTES

# --- the candidates ----------------------------------------------------------------------

#: from TRIAL_PROBE_BYTES, a candidate the model predicts this much slower than its favourite
#: is not timed (the library's call apart)
TRIAL_MODEL_PRUNE = 3.0
#: the trial times (or probes) the model's this many fastest of each way of moving data
TRIAL_WAY_TOP = 3
#: on one node, ``hierarchical`` is a candidate below this many bytes only (the window's
#: turn areas)
HIERARCHICAL_ONE_NODE_BYTES = _TURN_BYTES

# --- the band a trial decides ------------------------------------------------------------

#: a trial times a call of at most this many bytes (a larger call's band is judged by it)
TRIAL_BYTES = 16 << 20
#: below this many bytes, a trial's pick holds for every integer dtype of the size too
TRIAL_SHARED_BYTES = 8 << 10

# --- the budget --------------------------------------------------------------------------

#: a trial may spend this many calls of its fastest candidate on a new size's first call,
#: plus TRIAL_FLOOR seconds
TRIAL_STEADY = 10
TRIAL_FLOOR = 20e-3

# --- the probe ---------------------------------------------------------------------------

#: from this many bytes on, the candidates are first timed on a sixteenth of the size
TRIAL_PROBE_BYTES = 1 << 20
#: a probed candidate's time is the fastest of this many calls
TRIAL_PROBE_CALLS = 3
#: at most TRIAL_FINALISTS of those probed within this factor of the fastest go on
TRIAL_PROBE_PRUNE = 1.5
TRIAL_FINALISTS = 3
#: more go on while the budget left holds this many full-size calls of each finalist
TRIAL_FINALIST_CALLS = 3
#: the model's favourite goes on where probed within this factor of the fastest
TRIAL_FAVOURITE_PRUNE = 2.0
#: the fastest of each way of moving data goes on where probed within this factor of the
#: fastest
TRIAL_WAY_PRUNE = 3.0
#: the library's blocking call probed within this factor of the fastest goes on to the
#: rounds, however slow its first calls
TRIAL_SETTLE = 1.2

# --- the first calls ---------------------------------------------------------------------

#: each candidate's fastest of this many calls after its first stands for it
TRIAL_WARM = 3
#: after a probe, of this many (one more where the budget holds a call of each finalist)
TRIAL_WARM_LARGE = 1
#: after a probe, a candidate whose first call takes this factor of the fastest call before
#: it is not called again
TRIAL_SLOW_FIRST = 2.0
#: after a probe, a finalist (but the first called, the model's favourite unless the
#: library's, and the library's call where it settles) is called only where the budget left
#: holds this many calls of its probe time scaled to the size
TRIAL_FIRST_CALLS = 3

# --- the rounds --------------------------------------------------------------------------

#: a candidate whose warm calls are this much slower than the fastest's is not timed in
#: the rounds, unless among the TRIAL_FINALISTS fastest or the model's favourite
TRIAL_PRUNE = 1.5
#: rounds of timed blocks at most
TRIAL_ROUNDS = 5
#: below TRIAL_PROBE_BYTES, at least this many rounds run, budget or not
TRIAL_MIN_ROUNDS = 2
#: the rounds leave this share of the budget to what follows them (the call itself, the
#: ranks' skew): their last blocks' line-ups overstep what they planned
TRIAL_RESERVE = 0.1
#: the shortest block worth timing (seconds)
TRIAL_BLOCK_SECONDS = 200e-6
#: a block of fewer calls than this follows one untimed call of its candidate
TRIAL_BLOCK_CALLS = 3
#: a candidate whose median is this much slower than the best median leaves after its round
TRIAL_DROP = 1.25

# --- the decision ------------------------------------------------------------------------

#: measured times within this factor of the fastest tie (the model's order breaks it)
TRIAL_TIE = 1.02
#: a window variant is picked only where it times this much faster than the fastest default
VARIANT_MARGIN = 1.15

# --- the other collectives' trial (.others) -----------------------------------------------

#: the trial of a collective other than all-reduce times the model's this many cheapest, the
#: node window's and the library's call
OTHER_MODEL_TOP = 2
#: from TRIAL_PROBE_BYTES, a candidate whose first call takes this factor of the fastest
#: first call is not called again, the library's apart (whose first call sets up)
OTHER_FIRST_PRUNE = 3.0
#: each candidate called again stands by its fastest of this many calls (from
#: TRIAL_PROBE_BYTES, of OTHER_WARM_LARGE, where the budget holds them)
OTHER_WARM = 3
OTHER_WARM_LARGE = 1

__all__ = [name for name in dir() if name.isupper() and not name.startswith("_")]
