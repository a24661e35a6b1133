"""Sessions: everything mlcomm keeps for one communicator, and the path of a call through it.

- :mod:`.call`: the :class:`Call`, what the caller asked, checked on the local rank alone;
- :mod:`.binder`: :func:`bind`, a call's checks, ``auto``'s choice, plan and binding;
- :mod:`.bound`: the :class:`BoundCall` it returns, which runs the call;
- :mod:`.memo`: the bound calls that repeats run, found by one lookup;
- :mod:`.cache`: the process-wide binding cache, bounded in bytes;
- :mod:`.compare`: comparing a call across the ranks;
- :mod:`.state`: the :class:`Session` of one communicator;
- :mod:`.lifetime`: a session's set-up (:func:`session_of`) and the end of the job;
- :mod:`.auto`: ``auto``'s policy, agreement and trial.
"""

from .binder import bind
from .bound import BoundCall
from .cache import CACHE_BYTES, cache_bytes, cached_bytes, describe_held, held
from .call import Call
from .lifetime import session_of, shrink
from .state import Session

__all__ = ["Call", "bind", "BoundCall", "Session", "session_of", "shrink", "CACHE_BYTES", "cache_bytes",
           "cached_bytes", "held", "describe_held"]
