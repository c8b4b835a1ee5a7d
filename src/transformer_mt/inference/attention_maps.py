"""Every attention weight of the model over one sentence pair, with readable BPE pieces.

One teacher-forced forward pass over a source and a chosen output (the model's translation, or
any text in the target language) records the weights of each :class:`MultiHeadAttention`
(:func:`transformer_mt.model.attention.record_attention_weights`: the explicit paper math on
each layer's own inputs). ``scripts/plot_attention.py`` draws them as PNG grids and the
service's page (:mod:`transformer_mt.serve`) as interactive heatmaps.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from transformer_mt.checkpoint import LoadedModel
from transformer_mt.data.tokenizer import Tokenizer
from transformer_mt.model.attention import record_attention_weights

#: The three kinds of attention of the encoder-decoder, in the order the page lists them.
KINDS = ("encoder_self", "decoder_self", "cross")


def token_labels(tokenizer: Tokenizer, ids: Sequence[int], side: str) -> list[str]:
    """Readable text of each subword of ``ids`` (``side`` is ``"src"`` or ``"tgt"``).

    Byte-level BPE may split one character over two pieces (``Ä`` = bytes C3 84); decoding the
    growing prefix shows the character on the piece that completes it and ``·`` on the piece
    before. A piece that is only a space shows as ``␣``.
    """
    tok = tokenizer
    special = {tok.pad_id: "<pad>", tok.bos_id: "<bos>", tok.eos_id: "<eos>", tok.unk_id: "<unk>"}
    hf = tok.src if side == "src" else tok.tgt
    labels: list[str] = []
    words: list[int] = []
    previous = ""
    for i in ids:
        if i in special:
            labels.append(special[i])
            continue
        words.append(i)
        text = hf.decode(words, skip_special_tokens=True).rstrip("\ufffd")
        piece = text[len(previous) :] if text.startswith(previous) else hf.decode([i])
        previous = text
        labels.append(piece.strip() or ("␣" if piece else "·"))
    return labels


@dataclass
class AttentionMaps:
    """The weights of one teacher-forced pass; ``S`` = source + ``<eos>``, ``T`` = output +
    ``<eos>`` (decoder positions)."""

    #: source pieces, ``<eos>`` last: the keys of encoder self- and cross-attention (S)
    src_labels: list[str]
    #: the piece each decoder position predicts (output, then ``<eos>``): the queries (T)
    out_labels: list[str]
    #: the piece fed at each decoder position (``<bos>``, then the output): self-attention keys
    in_labels: list[str]
    #: per layer, ``(H, S, S)``
    encoder_self: list[Tensor]
    #: per layer, ``(H, T, T)``
    decoder_self: list[Tensor]
    #: per layer, ``(H, T, S)``
    cross: list[Tensor]


@torch.no_grad()
def record_maps(
    loaded: LoadedModel, src_ids: Sequence[int], out_ids: Sequence[int]
) -> AttentionMaps:
    """Record every attention weight of ``loaded.model`` for ``src_ids`` -> ``out_ids``.

    Args:
        src_ids: source ids without ``<eos>`` (it is appended, as in training).
        out_ids: output ids without ``<bos>``/``<eos>`` (both are added).
    """
    model, tok, device = loaded.model, loaded.tokenizer, loaded.device
    src_row = [*src_ids, tok.eos_id]
    out_row = [*out_ids, tok.eos_id]
    in_row = [tok.bos_id, *out_ids]
    src = torch.tensor([src_row], device=device)  # (1, S)
    tgt_in = torch.tensor([in_row], device=device)  # (1, T)
    with record_attention_weights(model) as records:
        model(src, tgt_in)

    def layers(stack: str, kind: str, n: int) -> list[Tensor]:
        return [records[f"{stack}.layers.{i}.{kind}"][0][0].float().cpu() for i in range(n)]

    n_enc, n_dec = len(model.encoder.layers), len(model.decoder.layers)
    return AttentionMaps(
        src_labels=token_labels(tok, src_row, "src"),
        out_labels=token_labels(tok, out_row, "tgt"),
        in_labels=token_labels(tok, in_row, "tgt"),
        encoder_self=layers("encoder", "self_attn", n_enc),  # (H, S, S) each
        decoder_self=layers("decoder", "self_attn", n_dec),  # (H, T, T) each
        cross=layers("decoder", "cross_attn", n_dec),  # (H, T, S) each
    )
