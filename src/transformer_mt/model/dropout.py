"""Dropout with a cheaper mask on CPU, and dropout fused into the residual addition.

``torch.nn.Dropout`` on CPU draws its mask with ``bernoulli_``; in a profile of a training step of
the small Multi30k model that draw was the largest cost after the matmuls (docs/design.md).
Comparing uniform numbers with ``p`` gives the same distribution (keep with probability
``1 - p``, scale kept values by ``1 / (1 - p)``) for less work, and the scaled mask lets the
residual connection ``x + Dropout(y)`` run as a single ``addcmul``.

The uniforms are 16-bit: torch's CPU generator makes numbers one at a time on one thread, and
one 64-bit draw costs little more than the single 24-bit float ``torch.rand`` takes from a draw,
so each 64-bit word is cut into four keep/drop decisions. ``p`` is then applied to within
``2**-17`` (it is rounded to a multiple of ``2**-16``), far below what any training run could
tell apart. On other devices (CUDA has a fused dropout kernel) this falls back to
``torch.nn.functional.dropout``. ``scripts/benchmark.py dropout`` measures both.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def _fast(x: Tensor, p: float) -> bool:
    return x.device.type == "cpu" and 0.0 < p < 1.0


#: Keep/drop decisions cut from one 64-bit random word: four 16-bit uniforms.
UNIFORMS_PER_WORD = 4


def keep_mask(like: Tensor, p: float) -> Tensor:
    """A scaled keep-mask shaped like ``like``: ``1 / (1 - p)`` where kept, 0 where dropped."""
    # Keep when uniform >= threshold: 2**16 * (1 - p) of the 2**16 values, p rounded to 2**-16.
    threshold = round(p * 2**16) - 2**15
    if threshold >= 2**15:  # p rounds to 1 (and int16 cannot hold 2**15): drop everything
        return torch.zeros_like(like)
    n = like.numel()
    words = torch.empty(-(-n // UNIFORMS_PER_WORD), dtype=torch.int64, device=like.device)
    # The full 64-bit range: every bit of every word is uniform, so are its four int16 views.
    words.random_(-(2**63), None)
    uniform = words.view(torch.int16)[:n].view(like.shape)  # uniform over [-2**15, 2**15)
    return (uniform >= threshold).to(like.dtype).mul_(1.0 / (1.0 - p))


def dropout(x: Tensor, p: float, training: bool = True) -> Tensor:
    """Functional form of :class:`Dropout` (``torch.nn.functional.dropout``'s contract)."""
    if not training or p == 0.0:
        return x
    if not _fast(x, p):
        return F.dropout(x, p, True)
    return x * keep_mask(x, p)


class Dropout(nn.Dropout):
    """``nn.Dropout`` (same ``p``, same train/eval behaviour) with :meth:`add` for residuals."""

    def forward(self, x: Tensor) -> Tensor:
        if self.inplace:
            return F.dropout(x, self.p, self.training, True)
        return dropout(x, self.p, self.training)

    def add(self, residual: Tensor, x: Tensor) -> Tensor:
        """``residual + dropout(x)``; on CPU in one pass (``addcmul``) over a scaled mask."""
        if not self.training or self.p == 0.0:
            return residual + x
        if not _fast(x, self.p):
            return residual + F.dropout(x, self.p, True)
        return torch.addcmul(residual, x, keep_mask(x, self.p))
