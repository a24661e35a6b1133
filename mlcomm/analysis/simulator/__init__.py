"""Cost simulator: run every rank's schedule against a network model.

Matching is MPI's: the i-th ``Send`` from rank s to rank d pairs with the
i-th ``Recv`` at d from s.  A rank posts all the transfers of a step at once
when its previous step is done; a message starts when both its send and its
receive are posted and a port is free at each end; it takes
``alpha + bytes * beta``.  The step is done when all its transfers are, plus
``gamma`` per reduced byte of its ``Reduce`` ops, plus ``copy_beta`` per byte of
its ``Copy`` ops that touch a node window slot or read a node peer's buffer (the
node's data movement; other copies are free, as in the lecture notes' model).

Node synchronisation: a ``Post`` is made when its step starts (it publishes the
writes of the steps before); an ``Await(peer, k)`` completes at the later of its
own step's start and ``peer``'s k-th post plus ``sync`` (a flag handed over through
shared cache lines: default ``alpha / 4``, the figure the window algorithms' closed
forms use); ``Await(peer, 0)`` (the previous collective) completes at once.  Awaits
take no port and move no bytes.

Port models: ``ports=1`` (default) is single-port full duplex: a rank sends one
message and receives one message at a time.  ``ports=k`` allows k of each;
``ports=0`` is unlimited.  Messages that are ready at the same time take a
port in order of ring distance ``(dst - src) mod p`` then message id, which is
how MPI libraries stagger their all-to-all exchanges, so a shifted exchange
of p-1 messages takes p-1 message times.

The two-level cluster model (``ranks_per_node > 1``) places ranks on nodes in
blocks (rank r on node r // ranks_per_node).  Messages within a node cost
``alpha + bytes * beta``; messages between nodes cost
``inter_alpha + bytes * inter_beta`` and also take a port of the sending and
the receiving node's NIC (``nic_ports`` of each; 0 = unlimited).

The event loop is compiled with Numba; every algorithm at p = 1024 simulates
in seconds, and ``hierarchical`` at 4096 ranks (8 per node) too (see
``bench/simulate_speed.py``).

Modules: ``network`` (:class:`Network`), ``program`` (schedules flattened and matched:
:func:`compile_schedules`), ``loop`` (the compiled event loop), ``contention`` (ports and
NICs), ``events`` (the heap of ready messages), ``engine`` (:func:`simulate`), ``path``
(:func:`critical_path`).
"""

from .engine import SimResult, simulate, simulate_schedules, step_costs
from .network import UNIT_NETWORK, Network
from .path import PATH_TERMS, critical_path
from .program import SimProgram, compile_schedules

__all__ = ["Network", "SimProgram", "SimResult", "compile_schedules", "simulate",
           "simulate_schedules", "step_costs", "critical_path", "PATH_TERMS", "UNIT_NETWORK"]
