"""Which algorithm runs: explicit argument, then ``MLCOMM_ALGORITHM``, then ``auto``.

``auto`` takes the measured choice of ``mlcomm tune`` where the profile has one for
this number of ranks. Otherwise, for an all-reduce, it measures: the first call of a new
size (to the power of two) and element type times every candidate on buffers of that
size (at most :data:`TRIAL_BYTES`), and every later call in that band runs the fastest
(:func:`agreed_choice`), whatever its op, unless the op changes which loop reduces it or
whether the library can; below :data:`TRIAL_SHARED_BYTES` the band holds every integer
dtype of the size too (:func:`_band_key`). The other collectives are timed alike, on
buffers of the call's shape (:mod:`.others`), but for the uneven forms whose counts
differ by rank. ``MLCOMM_AUTO=model`` (or a device buffer on the direct path, or one of
those uneven forms) takes the cost model's prediction instead.

Its modules, each importing only those above it:

- :mod:`.tuning`: the constants (docs/tuning.rst gives what set each);
- :mod:`.policy`: what is asked, the candidates, the model's choice, the size bands;
- :mod:`.agreement`: one choice per band across the ranks, and the trial's times reduced;
- :mod:`.plans`: the plan of any algorithm for a call (:func:`plan_call`), a trial's
  distinct plans;
- :mod:`.arena`: the buffers a trial's candidates share;
- :mod:`.rounds`: the trial's timed rounds (:func:`round_order`) and its pick;
- :mod:`.trial`: the timed trial, step by step;
- :mod:`.others`: the other collectives' timed trial;
- :mod:`.choice`: :func:`agreed_choice`, which runs the trial where the ranks agreed to.
"""

from .agreement import auto_ran
from .arena import _Arena
from .choice import agreed_choice
from .plans import distinct_plans, plan_call
from .policy import BLOCKING, VARIANTS, WINDOW_ONLY, _band_key, _propose, _way, auto_choice, \
    requested
from .rounds import round_order, round_period, trial_pick
from .trial import _probe, _timed, _trial
from .tuning import *  # noqa: F401,F403 (the constants, read here; set them on .tuning)

__all__ = ["requested", "auto_choice", "agreed_choice", "auto_ran", "plan_call",
           "round_order", "round_period", "TRIAL_BYTES"]
