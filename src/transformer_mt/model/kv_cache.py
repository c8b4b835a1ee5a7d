"""Keys and values of one attention layer kept between decoding steps (incremental decoding).

Shape letters as in :mod:`transformer_mt.model.attention`; ``T_seen`` is the number of
positions stored so far.
"""

from __future__ import annotations

import torch
from torch import Tensor


class KVCache:
    """Keys ``k (B, H, T_seen, d_k)`` and values ``v (B, H, T_seen, d_v)`` of one attention layer.

    Self-attention appends one step at a time (:meth:`append`); cross-attention fills it once
    from the encoder output (:meth:`set`) and reuses it. :meth:`reorder` selects batch rows
    (beam search keeps the surviving hypotheses; finished sentences leave the batch).

    Appending writes into a preallocated buffer whose length doubles when full, so a step costs
    one small copy instead of re-concatenating the whole history (``torch.cat`` per step is
    quadratic in the output length). ``k``/``v`` are views of the filled part.
    """

    def __init__(self) -> None:
        self._k: Tensor | None = None  # (B, H, capacity, d_k)
        self._v: Tensor | None = None  # (B, H, capacity, d_v)
        self.length = 0

    @property
    def k(self) -> Tensor | None:
        return None if self._k is None else self._k[:, :, : self.length]  # (B, H, T_seen, d_k)

    @property
    def v(self) -> Tensor | None:
        return None if self._v is None else self._v[:, :, : self.length]  # (B, H, T_seen, d_v)

    @property
    def is_empty(self) -> bool:
        return self._k is None

    def set(self, k: Tensor, v: Tensor) -> None:
        """Store ``k``/``v`` as the whole cache (cross-attention).

        Stored contiguous: the heads of a projection are strided views, which every later
        step's batched matmul would otherwise copy again.
        """
        self._k, self._v, self.length = k.contiguous(), v.contiguous(), k.size(2)

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Add ``T`` new positions ``(B, H, T, d)``; return all keys and values so far."""
        if torch.is_grad_enabled() and (k.requires_grad or v.requires_grad):
            # Writing into a buffer that earlier steps' outputs view would break autograd:
            # concatenate instead (differentiable decoding is rare; search runs without grad).
            previous_k, previous_v = self.k, self.v
            if previous_k is not None and previous_v is not None:
                k = torch.cat([previous_k, k], dim=2)  # (B, H, T_seen + T, d_k)
                v = torch.cat([previous_v, v], dim=2)  # (B, H, T_seen + T, d_v)
            self.set(k, v)
            return k, v
        start, end = self.length, self.length + k.size(2)
        if self._k is None or self._v is None or end > self._k.size(2):
            capacity = max(16, end, 2 * start)
            self._k = _with_room(self._k, k, start, capacity)
            self._v = _with_room(self._v, v, start, capacity)
        self._k[:, :, start:end] = k
        self._v[:, :, start:end] = v
        self.length = end
        return self._k[:, :, :end], self._v[:, :, :end]  # (B, H, T_seen + T, d_k / d_v)

    def reorder(self, index: Tensor) -> None:
        """Keep batch rows ``index (B',)``, in that order."""
        if self._k is not None and self._v is not None:
            # The whole buffer (at most twice the filled part) in one copy, no temporary.
            self._k = self._k.index_select(0, index)  # (B', H, capacity, d_k)
            self._v = self._v.index_select(0, index)  # (B', H, capacity, d_v)


def _with_room(buffer: Tensor | None, new: Tensor, length: int, capacity: int) -> Tensor:
    """A ``(B, H, capacity, d)`` buffer like ``new`` holding the first ``length`` of ``buffer``."""
    grown = new.new_empty(*new.shape[:2], capacity, new.size(3))
    if buffer is not None and length:
        grown[:, :, :length] = buffer[:, :, :length]
    return grown
