"""Gradient compressors whose packed payloads really are smaller on the wire.

Each compressor packs a float vector into a ``uint8`` byte string
(``compress``) and adds an unpacked payload into a dense vector
(``decompress_add``).  Formats (little endian):

- ``none``: the vector itself.
- ``fp16``: ``n`` float16 values.
- ``topk:RATIO``: ``k`` indices (uint16 when the vector has < 65536 entries,
  else uint32) then ``k`` float32 values; with error feedback (the part not sent
  is kept and added to the next gradient).
- ``qsgd:LEVELS``: one float32 scale (the L2 norm) per bucket of 512 entries,
  then ``n`` signed levels, stochastically rounded (Alistarh et al.): two 4-bit
  levels per byte up to 7 levels, int8 up to 127, int16 above.
"""

from __future__ import annotations

import numpy as np

__all__ = ["Compressor", "NoCompression", "FP16", "TopK", "QSGD", "get_compressor"]

_CHOICES = "none, fp16, topk:RATIO (0 < RATIO <= 1) or qsgd:LEVELS (1 <= LEVELS <= 32767)"


class Compressor:
    """Base class: identity packing of the vector's own bytes."""

    name = "none"
    dense = True  # the payload has a fixed size and may be all-reduced elementwise

    def compress(self, vec: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(vec).view(np.uint8)

    def decompress_add(self, payload: np.ndarray, out: np.ndarray) -> None:
        out += payload.view(out.dtype)

    def state(self) -> dict:
        return {}

    def load(self, state: dict) -> None:
        pass


class NoCompression(Compressor):
    pass


class FP16(Compressor):
    name = "fp16"

    def compress(self, vec):
        return vec.astype(np.float16).view(np.uint8)

    def decompress_add(self, payload, out):
        out += payload.view(np.float16).astype(out.dtype)


class TopK(Compressor):
    """Send the ``ratio`` largest-magnitude entries; keep the rest as error feedback."""

    dense = False

    def __init__(self, ratio: float, feedback: bool = True):
        self.ratio = float(ratio)
        self.feedback = feedback
        self.name = f"topk:{ratio:g}"
        self.residual = None

    def _idx_dtype(self, n):
        return np.uint16 if n < 65536 else np.uint32

    def compress(self, vec):
        n = vec.size
        if self.feedback:
            if self.residual is None:
                self.residual = np.zeros_like(vec)
            acc = self.residual
            acc += vec
        else:
            acc = vec.copy()
        k = max(1, min(n, int(np.ceil(self.ratio * n))))
        idx = np.argpartition(np.abs(acc), n - k)[n - k:] if k < n else np.arange(n)
        idx = np.sort(idx)
        vals = acc[idx].astype(np.float32)
        if self.feedback:
            acc[idx] = 0  # what was sent leaves the residual
        return np.concatenate([idx.astype(self._idx_dtype(n)).view(np.uint8), vals.view(np.uint8)])

    def decompress_add(self, payload, out):
        it = np.dtype(self._idx_dtype(out.size)).itemsize
        k = payload.size // (it + 4)
        idx = payload[:k * it].view(self._idx_dtype(out.size))
        vals = payload[k * it:].view(np.float32)
        out[idx] += vals.astype(out.dtype)

    def state(self):
        return {} if self.residual is None else {"residual": self.residual.copy()}

    def load(self, state):
        if "residual" in state:
            self.residual = np.array(state["residual"])


class QSGD(Compressor):
    """Stochastic quantisation of |g|/||g|| to ``levels`` levels, with the sign, per bucket.

    As in Alistarh et al., the vector is cut into buckets of ``bucket`` entries,
    each with its own float32 norm, which keeps the variance bounded.
    """

    def __init__(self, levels: int, seed: int = 0, bucket: int = 512):
        self.levels = int(levels)
        self.bucket = int(bucket)
        self.name = f"qsgd:{levels}"
        self.qtype = np.int8 if self.levels <= 127 else np.int16
        self.rng = np.random.default_rng([seed, 31])

    def _nb(self, n):
        return -(-n // self.bucket)

    def compress(self, vec):
        n, b = vec.size, self.bucket
        nb = self._nb(n)
        padded = np.zeros(nb * b, np.float64)
        padded[:n] = vec
        blocks = padded.reshape(nb, b)
        norms = np.linalg.norm(blocks, axis=1).astype(np.float32)
        safe = np.where(norms > 0, norms, 1).astype(np.float64)
        r = np.abs(blocks) / safe[:, None] * self.levels
        low = np.floor(r)
        level = low + (self.rng.random(r.shape) < (r - low))
        q = (np.sign(blocks) * level).reshape(-1)[:n].astype(self.qtype)
        if self.levels <= 7:  # two signed 4-bit levels per byte
            nib = (q.astype(np.int16) + 8).astype(np.uint8)
            if nib.size % 2:
                nib = np.append(nib, np.uint8(8))
            q = nib[0::2] | (nib[1::2] << 4)
        return np.concatenate([norms.view(np.uint8), q.view(np.uint8)])

    def decompress_add(self, payload, out):
        n, b = out.size, self.bucket
        nb = self._nb(n)
        norms = payload[:4 * nb].view(np.float32).astype(np.float64)
        body = payload[4 * nb:]
        if self.levels <= 7:
            q = np.empty(2 * body.size, np.int16)
            q[0::2] = (body & 15).astype(np.int16) - 8
            q[1::2] = (body >> 4).astype(np.int16) - 8
            q = q[:n]
        else:
            q = body.view(self.qtype)
        scale = np.repeat(norms / self.levels, b)[:n]
        out += (q * scale).astype(out.dtype)

    def state(self):
        import json
        return {"rng": json.dumps(self.rng.bit_generator.state)}

    def load(self, state):
        import json
        if "rng" in state:
            self.rng.bit_generator.state = json.loads(str(state["rng"]))


def get_compressor(spec: str | None, *, seed: int = 0) -> Compressor:
    """Parse ``--compress`` (``none``, ``fp16``, ``topk:RATIO``, ``qsgd:LEVELS``)."""
    spec = (spec or "none").strip().lower()
    name, _, arg = spec.partition(":")
    try:
        if name == "none" and not arg:
            return NoCompression()
        if name == "fp16" and not arg:
            return FP16()
        if name == "topk":
            ratio = float(arg)
            if 0 < ratio <= 1:
                return TopK(ratio)
        elif name == "qsgd":
            levels = int(arg)
            if 1 <= levels <= 32767:
                return QSGD(levels, seed=seed)
    except ValueError:
        pass
    raise ValueError(f"--compress: unknown or malformed compressor {spec!r} (choose {_CHOICES})")
