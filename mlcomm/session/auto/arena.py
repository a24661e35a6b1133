"""The buffers a trial's candidates share."""

from __future__ import annotations

import numpy as np

from ...runtime.binding import host_scratch


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
        if self.calls:  # no arrays of its own to write (docs/tuning.rst)
            self.inp, self.out = buffers
            if np.may_share_memory(self.inp, self.out):
                self.alias, self._saved = 0, self.out[:n].copy()
            else:
                # written once, so that no candidate's first call pays the page faults of
                # a fresh output (docs/tuning.rst)
                self.out.fill(0)

    def restore(self):
        """Put an in-place call's data back, which the candidates' calls overwrote."""
        if self._saved is not None:
            self.out[:self._saved.size] = self._saved

    @property
    def itemsize(self) -> int:
        return self.inp.dtype.itemsize

    def reserve(self, plans, m) -> int:
        """Room for calls of ``m`` elements of ``plans``, touched, as a repeated call finds
        it; the bytes of new memory it touched."""
        touched = 0
        if m > self.inp.size:
            self.inp, self.out = np.ones(m, self.inp.dtype), np.ones(m, self.inp.dtype)
            touched += self.inp.nbytes + self.out.nbytes
        need = max((plan.program.counts[2] for plan in plans), default=0)
        if need > self.scratch.size:
            # a binding may keep it
            self.scratch = host_scratch(need, self.scratch.dtype, touched=True)
            touched += self.scratch.nbytes
        return touched

    def bind(self, plan, m):
        """``plan`` bound to the arena's first ``m`` elements (freed by the caller)."""
        self.reserve([plan], m)
        return self.session.own_binding(plan, self.inp[:m], self.out[:m],
                                        self.scratch[:plan.program.counts[2]])
