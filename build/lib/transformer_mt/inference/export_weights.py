"""Our parameters under Marian/Pegasus names, with the d_model features permuted.

Their sinusoidal position table holds the sines of all frequencies, then the cosines; ours
interleaves them (column 2i sine, 2i+1 cosine). Renaming the residual stream's features by that
fixed permutation makes our table theirs: weights that read the stream get their input columns
permuted, weights that write it their rows, LayerNorm (which treats features alike) its gain and
bias. The network then computes the same function in the new coordinates.
"""

from __future__ import annotations

import torch

from transformer_mt.model.transformer import Transformer


def feature_permutation(d_model: int) -> torch.Tensor:
    """Index ``p`` with ``ours[:, p] == standard`` for the sinusoidal tables.

    Ours: column 2i = sin(pos * w_i), 2i+1 = cos(pos * w_i). Marian/Pegasus: the sines of all
    frequencies, then the cosines.
    """
    return torch.cat([torch.arange(0, d_model, 2), torch.arange(1, d_model, 2)])


def convert_state_dict(model: Transformer, pre_ln: bool) -> dict[str, torch.Tensor]:
    """Our parameters under the standard class's names, in the permuted feature order.

    ``pre_ln``: the target has final LayerNorms on both stacks (Pegasus).
    """
    config = model.config
    p = feature_permutation(config.d_model)
    state = {k: v.detach().float() for k, v in model.state_dict().items()}

    def reads(w: torch.Tensor) -> torch.Tensor:  # (out, d_model): permute input columns
        return w[:, p].contiguous()

    def writes(w: torch.Tensor) -> torch.Tensor:  # (d_model, ...) or (d_model,): permute rows
        return w[p].contiguous()

    out: dict[str, torch.Tensor] = {}

    def linear(ours: str, theirs: str, read: bool, write: bool) -> None:
        w, b = state[f"{ours}.weight"], state.get(f"{ours}.bias")
        if read:
            w = reads(w)
        if write:
            w = writes(w)
            b = writes(b) if b is not None else None
        out[f"{theirs}.weight"] = w
        if b is not None:
            out[f"{theirs}.bias"] = b.contiguous()

    def norm(ours: str, theirs: str) -> None:
        out[f"{theirs}.weight"] = writes(state[f"{ours}.weight"])
        out[f"{theirs}.bias"] = writes(state[f"{ours}.bias"])

    def attention(ours: str, theirs: str) -> None:
        for proj in ("q_proj", "k_proj", "v_proj"):
            linear(f"{ours}.{proj}", f"{theirs}.{proj}", read=True, write=False)
        linear(f"{ours}.out_proj", f"{theirs}.out_proj", read=False, write=True)

    def ffn(ours: str, theirs: str) -> None:
        linear(f"{ours}.feed_forward.linear1", f"{theirs}.fc1", read=True, write=False)
        linear(f"{ours}.feed_forward.linear2", f"{theirs}.fc2", read=False, write=True)

    src_emb = reads(state["encoder.embedding.token.weight"])
    tgt_emb = reads(state["decoder.embedding.token.weight"])
    out["model.encoder.embed_tokens.weight"] = src_emb
    out["model.decoder.embed_tokens.weight"] = tgt_emb
    if config.share_encoder_decoder_embeddings:
        out["model.shared.weight"] = src_emb
    out["lm_head.weight"] = reads(state["generator.weight"])
    for i in range(config.n_encoder_layers):
        ours, theirs = f"encoder.layers.{i}", f"model.encoder.layers.{i}"
        attention(f"{ours}.self_attn", f"{theirs}.self_attn")
        norm(f"{ours}.sublayer1.norm", f"{theirs}.self_attn_layer_norm")
        ffn(ours, theirs)
        norm(f"{ours}.sublayer2.norm", f"{theirs}.final_layer_norm")
    for i in range(config.n_decoder_layers):
        ours, theirs = f"decoder.layers.{i}", f"model.decoder.layers.{i}"
        attention(f"{ours}.self_attn", f"{theirs}.self_attn")
        norm(f"{ours}.sublayer1.norm", f"{theirs}.self_attn_layer_norm")
        attention(f"{ours}.cross_attn", f"{theirs}.encoder_attn")
        norm(f"{ours}.sublayer2.norm", f"{theirs}.encoder_attn_layer_norm")
        ffn(ours, theirs)
        norm(f"{ours}.sublayer3.norm", f"{theirs}.final_layer_norm")
    if pre_ln:
        norm("encoder.norm", "model.encoder.layer_norm")
        norm("decoder.norm", "model.decoder.layer_norm")
    return out
