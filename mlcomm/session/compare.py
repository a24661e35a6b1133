"""Comparing a call across the ranks: one place for ``validate=``, ``auto``'s agreement
and the torch backend's checks.

A call's signature is a tuple of named fields. Where the ranks' signatures differ, every
rank raises the same ValueError, naming the ranks and the first one's differing fields, as
the ranks would otherwise go on to run different collectives, or the same one on
different counts.
"""

from __future__ import annotations

__all__ = ["differing_calls", "compare_calls"]


def differing_calls(signatures, fields) -> str | None:
    """Where the ranks' call ``signatures`` (one per rank, each a tuple of ``fields``)
    differ from rank 0's, in words: the ranks, and the first one's differing fields; None
    where they agree."""
    reference = signatures[0]
    differ = [r for r, s in enumerate(signatures) if s != reference]
    if not differ:
        return None
    diffs = [f"{f}: rank 0 has {a!r}, rank {differ[0]} has {b!r}"
             for f, a, b in zip(fields, reference, signatures[differ[0]]) if a != b]
    return (f"mlcomm: ranks {differ} called with arguments that differ from rank 0 "
            f"({'; '.join(diffs)})")


def compare_calls(session, fields, signature, error=None, what="validate=True's comparison "
                  "of the calls") -> None:
    """Compare this rank's call ``signature`` (a tuple of ``fields``) with every other
    rank's, once the started calls are complete; raise the same error on every rank where
    they differ, or where the call failed its local checks on any rank (``error``: this
    rank's, or None)."""
    session.wait_started()
    session.watch.barrier(session.comm, what)
    everyone = session.comm.allgather((signature, None if error is None else str(error)))
    failed = {r: e for r, (_, e) in enumerate(everyone) if e is not None}
    if failed:
        if error is not None:
            raise error
        raise ValueError("mlcomm: the call failed on ranks " + ", ".join(
            f"{r} ({e})" for r, e in sorted(failed.items())))
    differ = differing_calls([s for s, _ in everyone], fields)
    if differ:
        raise ValueError(differ)
