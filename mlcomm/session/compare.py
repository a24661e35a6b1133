"""Comparing a call across the ranks: one place for ``validate=``, ``auto``'s agreement
and the torch backend's checks.

A call's signature is a tuple of named fields. Where the ranks' signatures differ, every
rank raises the same ValueError, naming the ranks and the first one's differing fields, as
the ranks would otherwise go on to run different collectives, or the same one on
different counts.
"""

from __future__ import annotations

__all__ = ["differing_calls", "compare_calls", "raise_differences"]


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
    raise_differences(everyone, error, fields)


def raise_differences(everyone, error, fields=None, what="mlcomm", failed=ValueError,
                      hint="") -> None:
    """Raise what the ranks' calls got wrong, the same on every rank: ``everyone`` holds
    each rank's ``(signature, its error in words or None)``, ``error`` this rank's own
    error, which it raises. Elsewhere a ``failed`` error names the ranks that failed; else
    a ValueError says how the signatures differ: by field of ``fields`` against rank 0's,
    or (``fields`` None: each signature is one description) every rank's in full, and
    ``hint``."""
    if error is not None:
        raise error
    failures = {r: e for r, (_, e) in enumerate(everyone) if e is not None}
    if failures:
        raise failed(f"{what}: the call failed on ranks " + ", ".join(
            f"{r} ({e})" for r, e in sorted(failures.items())))
    signatures = [s for s, _ in everyone]
    if fields is not None:
        differ = differing_calls(signatures, fields)
        if differ:
            raise ValueError(differ)
    elif any(s != signatures[0] for s in signatures):
        raise ValueError(f"{what}: the ranks' calls differ (" + "; ".join(
            f"rank {r}: {s}" for r, s in enumerate(signatures)) + f"){hint}")
