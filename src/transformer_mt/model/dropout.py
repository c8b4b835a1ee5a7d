"""Dropout with a cheaper mask on CPU, and dropout fused into the residual addition.

``torch.nn.Dropout`` on CPU draws its mask with ``bernoulli_``, which in a training step of the
small Multi30k model cost more than everything but the matmuls. Comparing uniform numbers with
``p`` gives the same distribution (keep with probability ``1 - p``, scale kept values by
``1 / (1 - p)``) for less work, and the scaled mask lets the residual connection
``x + Dropout(y)`` run as a single ``addcmul``. On other devices (CUDA has a fused dropout
kernel) this falls back to ``torch.nn.functional.dropout``. ``scripts/benchmark.py dropout``
measures both.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def _fast(x: Tensor, p: float) -> bool:
    return x.device.type == "cpu" and 0.0 < p < 1.0


def keep_mask(like: Tensor, p: float) -> Tensor:
    """A scaled keep-mask shaped like ``like``: ``1 / (1 - p)`` where kept, 0 where dropped."""
    uniform = torch.rand(like.shape, device=like.device)  # float32 whatever ``like`` holds
    return (uniform >= p).to(like.dtype).mul_(1.0 / (1.0 - p))


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
