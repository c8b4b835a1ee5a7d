"""Our parameters under Marian/Pegasus names, with the d_model features permuted.

Their position table holds all sines, then all cosines; ours interleaves them. Renaming the
residual stream's features by that permutation (input columns of weights that read it, rows of
those that write it, LayerNorm's gain and bias) computes the same function in their order.
"""

from __future__ import annotations

import torch

from transformer_mt.model.transformer import Transformer


def feature_permutation(d_model: int) -> torch.Tensor:
    """Index ``p`` with ``ours[:, p] == standard`` for the sinusoidal tables."""
    return torch.cat([torch.arange(0, d_model, 2), torch.arange(1, d_model, 2)])


class _Renamer:
    """Copies our tensors under the standard class's names, permuting the feature axis."""

    def __init__(self, model: Transformer) -> None:
        self.p = feature_permutation(model.config.d_model)
        self.state = {k: v.detach().float() for k, v in model.state_dict().items()}
        self.out: dict[str, torch.Tensor] = {}

    def reads(self, w: torch.Tensor) -> torch.Tensor:  # (out, d_model): permute input columns
        return w[:, self.p].contiguous()

    def writes(self, w: torch.Tensor) -> torch.Tensor:  # (d_model, ...): permute rows
        return w[self.p].contiguous()

    def linear(self, ours: str, theirs: str, *, read: bool, write: bool) -> None:
        w, b = self.state[f"{ours}.weight"], self.state.get(f"{ours}.bias")
        if read:
            w = self.reads(w)
        if write:
            w = self.writes(w)
            b = self.writes(b) if b is not None else None
        self.out[f"{theirs}.weight"] = w
        if b is not None:
            self.out[f"{theirs}.bias"] = b.contiguous()

    def norm(self, ours: str, theirs: str) -> None:
        self.out[f"{theirs}.weight"] = self.writes(self.state[f"{ours}.weight"])
        self.out[f"{theirs}.bias"] = self.writes(self.state[f"{ours}.bias"])

    def attention(self, ours: str, theirs: str) -> None:
        for proj in ("q_proj", "k_proj", "v_proj"):
            self.linear(f"{ours}.{proj}", f"{theirs}.{proj}", read=True, write=False)
        self.linear(f"{ours}.out_proj", f"{theirs}.out_proj", read=False, write=True)

    def ffn(self, ours: str, theirs: str) -> None:
        self.linear(f"{ours}.feed_forward.linear1", f"{theirs}.fc1", read=True, write=False)
        self.linear(f"{ours}.feed_forward.linear2", f"{theirs}.fc2", read=False, write=True)


def convert_state_dict(model: Transformer, pre_ln: bool) -> dict[str, torch.Tensor]:
    """Our parameters under the standard class's names, in the permuted feature order.

    ``pre_ln``: the target has final LayerNorms on both stacks (Pegasus).
    """
    config, r = model.config, _Renamer(model)
    src_emb = r.reads(r.state["encoder.embedding.token.weight"])
    r.out["model.encoder.embed_tokens.weight"] = src_emb
    r.out["model.decoder.embed_tokens.weight"] = r.reads(r.state["decoder.embedding.token.weight"])
    if config.share_encoder_decoder_embeddings:
        r.out["model.shared.weight"] = src_emb
    r.out["lm_head.weight"] = r.reads(r.state["generator.weight"])
    for i in range(config.n_encoder_layers):
        ours, theirs = f"encoder.layers.{i}", f"model.encoder.layers.{i}"
        r.attention(f"{ours}.self_attn", f"{theirs}.self_attn")
        r.norm(f"{ours}.sublayer1.norm", f"{theirs}.self_attn_layer_norm")
        r.ffn(ours, theirs)
        r.norm(f"{ours}.sublayer2.norm", f"{theirs}.final_layer_norm")
    for i in range(config.n_decoder_layers):
        ours, theirs = f"decoder.layers.{i}", f"model.decoder.layers.{i}"
        r.attention(f"{ours}.self_attn", f"{theirs}.self_attn")
        r.norm(f"{ours}.sublayer1.norm", f"{theirs}.self_attn_layer_norm")
        r.attention(f"{ours}.cross_attn", f"{theirs}.encoder_attn")
        r.norm(f"{ours}.sublayer2.norm", f"{theirs}.encoder_attn_layer_norm")
        r.ffn(ours, theirs)
        r.norm(f"{ours}.sublayer3.norm", f"{theirs}.final_layer_norm")
    if pre_ln:
        r.norm("encoder.norm", "model.encoder.layer_norm")
        r.norm("decoder.norm", "model.decoder.layer_norm")
    return r.out
