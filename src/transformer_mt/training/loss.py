"""The training loss: label-smoothed cross-entropy over non-pad tokens (paper section 5.4),
and target word dropout, which perturbs the decoder's teacher-forced input."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

#: ``module.word_dropout_mode``: what a dropped decoder input token becomes.
WORD_DROPOUT_MODES = ("unk", "zero")


def target_word_dropout(tgt_in: Tensor, p: float, mode: str, *, pad_id: int, unk_id: int) -> Tensor:
    """The decoder input ``tgt_in (B, T)`` with each token dropped with probability ``p``.

    ``unk`` replaces a dropped token with ``<unk>``; ``zero`` with ``<pad>``, whose embedding
    is zero (Gal and Ghahramani, 2016; Sennrich et al., 2016). ``<bos>``, padding and the
    labels are untouched. The draw uses the global RNG, which checkpoints save.
    """
    if p <= 0.0:
        return tgt_in
    drop = torch.rand(tgt_in.shape, device=tgt_in.device) < p  # (B, T)
    drop[:, 0] = False
    drop &= tgt_in != pad_id
    return tgt_in.masked_fill(drop, unk_id if mode == "unk" else pad_id)


def label_smoothed_loss(
    logits: Tensor, target: Tensor, pad_id: int, label_smoothing: float
) -> tuple[Tensor, Tensor, Tensor]:
    """Mean label-smoothed cross-entropy over non-pad tokens.

    Returns ``(loss, nll_sum, n_tokens)``: the smoothed mean loss to optimise, plus the plain
    negative log-likelihood summed over tokens (for perplexity) and the token count.
    """
    vocab = logits.size(-1)
    flat_target = target.reshape(-1)  # (N,) with N = B*T
    # One log-softmax serves both the loss and the plain NLL (perplexity).
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
