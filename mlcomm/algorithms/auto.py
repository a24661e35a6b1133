"""``auto``: the registry's name for the choice mlcomm makes per call (``mlcomm.session.auto``
makes it), an entry with no schedule of its own."""

from ._registry import register
from .native import native_cost

__all__ = ["AUTO"]

AUTO = "auto"

register(AUTO, "allreduce", None, native_cost,
         doc="Pick the algorithm with the least predicted time for this size and rank count.")
