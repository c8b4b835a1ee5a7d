"""The training loss: label-smoothed cross-entropy over non-pad tokens (paper section 5.4),
and target word dropout, which perturbs the decoder's teacher-forced input."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

#: ``module.word_dropout_mode``: what a dropped decoder input token becomes.
WORD_DROPOUT_MODES = ("unk", "zero")


def target_word_dropout(tgt_in: Tensor, p: float, mode: str, *, pad_id: int, unk_id: int) -> Tensor:
    """The decoder input ``tgt_in (B, T)`` with each token dropped with probability ``p``.

    ``unk`` replaces a dropped token with ``<unk>`` (a learned "some word" embedding);
    ``zero`` replaces it with ``<pad>``, whose embedding is the zero vector, so the position
    keeps only its positional encoding (word dropout as in Gal and Ghahramani, 2016, and
    Sennrich et al., 2016). The first column (``<bos>``) and padding are never dropped, and the
    labels are untouched: the model must predict the next word without seeing every earlier
    one. The draw uses the global RNG, which checkpoints save, so resuming replays it.
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


def _softmax_terms(
    z: Tensor, target: Tensor, label_smoothing: float
) -> tuple[Tensor, Tensor | None, Tensor, Tensor]:
    """The loss's terms for logits ``z (c, V)``, whose buffer becomes ``exp(z - max)``.

    Returns ``(nll, uniform, e, total)`` per row: ``-log p_t``, ``mean_j(-log p_j)`` (``None``
    without smoothing), the exponentials (``z``'s own buffer) and their sum, so ``e / total`` is
    the softmax. Under bf16 the passes over ``(c x V)`` cost more than the products, so it is
    built in one buffer: shift by the row maximum, exponentiate.
    """
    z.sub_(z.amax(dim=-1, keepdim=True))  # shifted: log-probabilities up to lse
    z_target = z.gather(1, target[:, None]).squeeze(1)  # (c,)
    z_mean = z.mean(dim=-1) if label_smoothing > 0.0 else None
    e = z.exp_()  # z is spent
    total = e.sum(dim=-1)  # (c,)
    lse = total.log()  # the shifted log-sum-exp
    return lse - z_target, None if z_mean is None else lse - z_mean, e, total


class _ChunkedProjectionLoss(torch.autograd.Function):
    """The output projection and the label-smoothed loss, a chunk of tokens at a time.

    Forward computes each chunk's logits, its share of the loss and, at once, the gradients of
    the loss with respect to the chunk's hidden states and to the projection weight (the
    gradient of a softmax cross-entropy needs nothing but the chunk's own probabilities), so
    the ``(tokens x vocabulary)`` logits and their gradient never exist whole. Backward scales
    the stored gradients by the incoming one.
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        hidden: Tensor,
        weight: Tensor,
        target: Tensor,
        options: tuple[int, float, int],
    ) -> tuple[Tensor, Tensor]:
        # apply() takes positional arguments only: the settings travel as one tuple.
        pad_id, label_smoothing, chunk = options
        vocab = weight.size(0)
        device = hidden.device.type
        keep = target != pad_id  # (N,)
        n_tokens = keep.sum()
        # Softmax and sums in float32 at least, as the plain loss computes them; the two
        # products in autocast's dtype when it is on, as the plain projection runs.
        acc = torch.promote_types(hidden.dtype, torch.float32)
        autocast = torch.is_autocast_enabled(device)
        low = torch.get_autocast_dtype(device) if autocast else hidden.dtype
        scale = 1.0 / n_tokens.clamp(min=1).to(acc)
        grad_hidden = torch.empty_like(hidden)
        grad_weight = torch.zeros(weight.shape, dtype=acc, device=weight.device)
        loss_sum = hidden.new_zeros((), dtype=acc)
        nll_sum = hidden.new_zeros((), dtype=acc)
        wants_grad = ctx.needs_input_grad[0] or ctx.needs_input_grad[1]
        # Every cast is explicit below: autocast would cast the weight and each chunk's
        # gradient again for every product.
        with torch.autocast(device, enabled=False):
            w, hs = weight.to(low), hidden.to(low)  # once, not once per chunk
            for start in range(0, hidden.size(0), chunk):
                h = hs[start : start + chunk]  # (c, d)
                t, k = target[start : start + chunk], keep[start : start + chunk]
                z = (h @ w.t()).to(acc)  # (c, V) logits
                nll, uniform, e, total = _softmax_terms(z, t, label_smoothing)
                nll = nll.masked_fill(~k, 0.0)  # -log p_t on kept rows
                nll_sum += nll.sum()
                if uniform is not None:
                    uniform = uniform.masked_fill(~k, 0.0)
                    loss_sum += ((1.0 - label_smoothing) * nll + label_smoothing * uniform).sum()
                else:
                    loss_sum += nll.sum()
                if not wants_grad:  # validation: the loss alone
                    continue
                # d loss / d logits = (p - (1 - eps) onehot(t) - eps / V) / N on kept rows.
                row = k.to(acc) * scale  # (c,)
                grad = e.mul_((row / total)[:, None])  # p, already scaled by its row's weight
                if label_smoothing > 0.0:
                    grad.sub_((row * (label_smoothing / vocab))[:, None])
                grad[torch.arange(len(t), device=t.device), t] -= (1.0 - label_smoothing) * row
                g = grad.to(low)
                grad_hidden[start : start + chunk] = (g @ w).to(hidden.dtype)
                grad_weight += g.t() @ h
        ctx.save_for_backward(grad_hidden, grad_weight.to(weight.dtype))
        ctx.mark_non_differentiable(nll_sum)
        return loss_sum / n_tokens, nll_sum

    @staticmethod
    def backward(ctx: Any, grad_loss: Tensor, _grad_nll: Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        grad_hidden, grad_weight = ctx.saved_tensors
        return grad_hidden * grad_loss, grad_weight * grad_loss, None, None


def chunked_label_smoothed_loss(
    hidden: Tensor,
    weight: Tensor,
    target: Tensor,
    *,
    pad_id: int,
    label_smoothing: float,
    chunk_tokens: int,
) -> tuple[Tensor, Tensor, Tensor]:
    """:func:`label_smoothed_loss` of ``hidden @ weight.T``, without the whole logits tensor.

    ``hidden (B, T, d_model)`` are the decoder's outputs, ``weight (V, d_model)`` the output
    projection (the generator). The result equals ``label_smoothed_loss(hidden @ weight.T,
    target, ...)`` (a test holds them equal, values and gradients), computed ``chunk_tokens``
    rows at a time.
    """
    flat = hidden.reshape(-1, hidden.size(-1))  # (N, d)
    flat_target = target.reshape(-1)  # (N,)
    loss, nll_sum = _ChunkedProjectionLoss.apply(
        flat, weight, flat_target, (pad_id, label_smoothing, int(chunk_tokens))
    )
    return loss, nll_sum, (flat_target != pad_id).sum()
