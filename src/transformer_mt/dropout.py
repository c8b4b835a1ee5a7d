"""Dropout with a cheaper mask on CPU, and dropout fused into the residual addition.

``torch.nn.Dropout`` on CPU draws its mask with ``bernoulli_``; in a profile of a training step of
the small Multi30k model that draw was the largest cost after the matmuls (12% of the step).
Drawing uniform numbers and comparing them with ``p`` gives the same distribution (keep with
probability ``1 - p``, scale kept values by ``1 / (1 - p)``) for less work, and the scaled mask
lets the residual connection ``x + Dropout(y)`` run as a single ``addcmul``. On other devices
(CUDA has a fused dropout kernel) this falls back to ``torch.nn.functional.dropout``.
``scripts/benchmark.py dropout`` measures both.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class Dropout(nn.Dropout):
    """``nn.Dropout`` (same ``p``, same train/eval behaviour) with :meth:`add` for residuals."""

    def _fast(self, x: Tensor) -> bool:
        return x.device.type == "cpu" and 0.0 < self.p < 1.0 and not self.inplace

    def mask(self, like: Tensor) -> Tensor:
        """A scaled keep-mask shaped like ``like``: ``1 / (1 - p)`` where kept, 0 where dropped."""
        # uniform [0, 1) >= p holds with probability 1 - p; ge_ writes 1.0/0.0 in place.
        return torch.rand_like(like).ge_(self.p).div_(1.0 - self.p)

    def forward(self, x: Tensor) -> Tensor:
        if not self.training or self.p == 0.0:
            return x
        if not self._fast(x):
            return F.dropout(x, self.p, True, self.inplace)
        return x * self.mask(x)

    def add(self, residual: Tensor, x: Tensor) -> Tensor:
        """``residual + dropout(x)``; on CPU in one pass (``addcmul``) over a scaled mask."""
        if not self.training or self.p == 0.0:
            return residual + x
        if not self._fast(x):
            return residual + F.dropout(x, self.p, True)
        return torch.addcmul(residual, x, self.mask(x))
