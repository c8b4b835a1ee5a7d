"""The training loss: label-smoothed cross-entropy over non-pad tokens (paper section 5.4)."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor


def label_smoothed_loss(
    logits: Tensor, target: Tensor, pad_id: int, label_smoothing: float
) -> tuple[Tensor, Tensor, Tensor]:
    """Mean label-smoothed cross-entropy over non-pad tokens.

    Returns ``(loss, nll_sum, n_tokens)``: the smoothed mean loss to optimise, plus the plain
    negative log-likelihood summed over tokens (for perplexity) and the token count.
    """
    vocab = logits.size(-1)
    flat_target = target.reshape(-1)  # (N,) with N = B*T
    # One log-softmax serves both the loss and the plain NLL (F.cross_entropy with label
    # smoothing computes the same terms internally; calling it twice would redo the
    # N x V log-softmax just for perplexity).
    lprobs = F.log_softmax(logits.reshape(-1, vocab).float(), dim=-1)  # (N, V)
    keep = flat_target != pad_id  # (N,)
    nll = -lprobs.gather(1, flat_target[:, None]).squeeze(1).masked_fill(~keep, 0.0)  # (N,)
    n_tokens = keep.sum()
    nll_total = nll.sum()
    if label_smoothing > 0.0:
        # Smoothing spreads epsilon uniformly over the vocabulary: eps * mean_j(-log p_j).
        uniform = -lprobs.sum(dim=-1).masked_fill(~keep, 0.0).sum() / vocab
        loss = ((1.0 - label_smoothing) * nll_total + label_smoothing * uniform) / n_tokens
    else:
        loss = nll_total / n_tokens
    nll_sum = nll_total.detach()
    return loss, nll_sum, n_tokens
