"""One cached decoding step whose shapes stay fixed for a whole search, so it can be compiled.

:meth:`Transformer.decode <transformer_mt.model.transformer.Transformer.decode>` over a
:class:`~transformer_mt.model.kv_cache.KVCache` is the readable path: the self-attention keys
and values grow by one position a step and the cache's bookkeeping is Python. A compiler
(``torch.compile``) would trace a new graph for every length. :class:`DecodingStep` computes the
same step from tensors whose shapes do not change during a search:

* the self-attention keys/values live in ``(n, H, T_max, d)`` buffers, where ``T_max`` is the
  search's longest possible output; step ``t`` writes position ``t`` in place;
* the new query attends to every buffer position through a mask of the positions ``<= t``
  (masked keys get weight exactly zero: the softmax of :func:`attention_weights`);
* the step number arrives as a tensor, so it is data, not a constant of the graph.

A decoding step is a few hundred small operations on one token per sentence; eagerly each costs
its Python dispatch, which outweighs the arithmetic of a small model. Compiled, they become a
few fused kernels. The layers' own modules (projections, LayerNorm, residual order, feed-forward)
compute the step, so the math is the paper's; tests hold it equal to ``Transformer.decode``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch._inductor.config as inductor_config
from torch import Tensor

from transformer_mt.model.attention import MultiHeadAttention, scaled_dot_product_attention
from transformer_mt.model.layers import DecoderLayer
from transformer_mt.model.transformer import Transformer

#: Rows a state holds at least: a single row would be a graph of its own (PyTorch specialises
#: sizes of one), so one sentence decodes as two identical rows, which costs little more.
MIN_ROWS = 2

#: Inductor options of the compiled step: ``cpp_wrapper``, the code that calls the kernels is
#: C++, not Python, which matters when a step is hundreds of small kernels.
COMPILE_OPTIONS: dict[str, Any] = {"cpp_wrapper": True}

#: Inductor options of the graph for calls of :data:`MIN_ROWS` rows (a lone sentence, greedy):
#: compiled with the weights frozen in (constants, not inputs), each matrix product is Inductor's
#: own C++ GEMM or the library's, whichever timed faster when the graph was compiled
#: (``max_autotune``), and the graph is specialised to its row count. Such a step runs far
#: faster than the general graph's; larger calls keep the general graph, which one compilation
#: serves for every row count (docs/benchmarks.md, "A compiled step for a lone sentence").
LONE_OPTIONS: dict[str, Any] = {
    **COMPILE_OPTIONS,
    "max_autotune": True,
    "max_autotune_gemm_backends": "CPP,ATEN",
    # the timings stay out of the user's terminal
    "autotune_num_choices_displayed": 0,
    "max_autotune_report_choices_stats": False,
}

#: Calls that find no fitting graph (per graph and thread count) after which that graph's guards
#: are always checked (later misses mean the shapes keep changing).
MAX_MISSES = 3


def _at_least_two(rows: Tensor) -> Tensor:
    """Row indices ``rows (n,)``, the first repeated where ``n`` is 1 (see :data:`MIN_ROWS`)."""
    return rows if rows.numel() >= MIN_ROWS else rows[:1].repeat(MIN_ROWS)


@dataclass
class StepState:
    """The search's decoding state for one model, one row per hypothesis (``rows`` of them).

    ``self_k``/``self_v``: per decoder layer, the self-attention buffers ``(n, H, T_max, d_k)``
    and ``(n, H, T_max, d_v)``; ``cross_k``/``cross_v``: the cross-attention keys/values of the
    encoder output, ``(n, H, S, d_k / d_v)``; ``src_mask``: ``(n, 1, 1, S)``. ``n`` is
    ``rows``, or :data:`MIN_ROWS` where ``rows`` is fewer (copies of the first row).
    """

    self_k: list[Tensor]
    self_v: list[Tensor]
    cross_k: list[Tensor]
    cross_v: list[Tensor]
    src_mask: Tensor
    rows: int

    def select(self, rows: Tensor) -> None:
        """Keep (and order) the rows ``rows (n',)`` of every tensor."""
        self.rows, rows = rows.numel(), _at_least_two(rows)
        for buffers in (self.self_k, self.self_v, self.cross_k, self.cross_v):
            buffers[:] = [b.index_select(0, rows) for b in buffers]
        self.src_mask = self.src_mask.index_select(0, rows)

    def reorder_self(self, rows: Tensor, written: int) -> None:
        """Beams moved within their sentence: only the self-attention buffers follow (a
        sentence's beams share its cross-attention keys/values).

        Only the ``written`` positions the steps so far wrote move, in place: the later ones
        are masked until a step overwrites them.
        """
        rows = _at_least_two(rows)
        for buffers in (self.self_k, self.self_v):
            for b in buffers:
                b[:, :, :written] = b[rows, :, :written]


class DecodingStep:
    """Next-token log-probabilities of ``model``, one token per row and step, over a
    :class:`StepState`.

    Args:
        model: The model, in eval mode.
        compile: Run the step through ``torch.compile``: calls of :data:`MIN_ROWS` rows
            through one graph (:data:`LONE_OPTIONS`, the weights frozen in as they are at its
            first call), larger ones through another (:data:`COMPILE_OPTIONS`). Other shapes
            are dynamic, so each graph serves every source length and ``T_max``, the second
            every batch size; PyTorch compiles them per thread count, each at its first call
            (tens of seconds on a small CPU). ``False`` runs the same code eagerly, as tests
            do.
    """

    def __init__(self, model: Transformer, *, compile: bool = False) -> None:
        self.model = model
        #: per graph ("lone", "general"), the callable that runs it (none: the step runs eagerly)
        self._graphs: dict[str, Callable[..., Tensor]] = {}
        if compile:
            self._graphs = {
                "lone": torch.compile(self._lone_call, dynamic=True, options=LONE_OPTIONS),
                "general": torch.compile(self.step, dynamic=True, options=COMPILE_OPTIONS),
            }
        #: graphs and thread counts this step has been called with, every guard checked
        self._checked: set[tuple[str, int]] = set()
        #: per graph and thread count, the calls that found no graph with the guards skipped
        self._misses: dict[tuple[str, int], int] = {}

    @torch.no_grad()
    def start(self, memory: Tensor, src_mask: Tensor, length: int) -> StepState:
        """The state before step 0 for ``memory (n, S, d_model)`` (the encoder output) and
        outputs of at most ``length`` tokens."""
        real = memory.size(0)
        rows = _at_least_two(torch.arange(real, device=memory.device))
        memory, src_mask = memory[rows], src_mask[rows]
        n, c = memory.size(0), self.model.config.attention
        self_k, self_v, cross_k, cross_v = [], [], [], []
        for layer in self.model.decoder.layers:
            attn = layer.cross_attn
            k, v = attn._project(memory, attn.k_proj, attn.v_proj)
            # Contiguous like every later state (rows selected are copies): the compiled graph
            # is specialised to its inputs' memory layout.
            cross_k.append(k.contiguous())  # (n, H, S, d_k)
            cross_v.append(v.contiguous())  # (n, H, S, d_v)
            # At least two positions too: a length of one would be a graph of its own.
            self_k.append(memory.new_zeros(n, c.n_heads, max(length, 2), c.d_k))
            self_v.append(memory.new_zeros(n, c.n_heads, max(length, 2), c.d_v))
        mask = src_mask.clone(memory_format=torch.contiguous_format)  # not a view, as later
        return StepState(self_k, self_v, cross_k, cross_v, mask, rows=real)

    @torch.no_grad()
    def log_probs(self, token: Tensor, position: Tensor, state: StepState) -> Tensor:
        """``token (rows, 1)`` at step ``position`` (a 0-dim long tensor) -> log-probabilities
        ``(rows, V)`` in float32; writes the step's keys/values into ``state``."""
        rows = token.size(0)
        # A fresh (n, 1) token tensor: a slice of the prefix would carry the prefix's strides,
        # and the compiled graph is specialised to its inputs' layout.
        token = token[_at_least_two(torch.arange(rows, device=token.device))]
        inputs = dict(
            self_k=state.self_k, self_v=state.self_v, cross_k=state.cross_k,
            cross_v=state.cross_v, src_mask=state.src_mask,
        )  # fmt: skip
        if not self._graphs:
            return self.step(token, position, **inputs)[:rows]
        graph = "lone" if rows <= MIN_ROWS else "general"
        key = (graph, torch.get_num_threads())
        if key in self._checked and self._misses.get(key, 0) < MAX_MISSES:
            # Checking every guard of the graph (each weight, each input's layout) costs about
            # as much as the step itself. The state's tensors are built here, always alike;
            # what tells the graphs apart (the thread count, and for the lone graph the model
            # whose weights it holds) is still checked.
            try:
                with torch.compiler.set_stance("default", skip_guard_eval_unsafe=True):
                    return self._graphs[graph](token, position, **inputs)[:rows]
            except RuntimeError as err:  # no graph fits: refused before anything ran
                if "Recompilation triggered" not in str(err):
                    raise
                self._misses[key] = self._misses.get(key, 0) + 1
        # Every guard checked, always so at this step's first call of a graph: with the guards
        # skipped, a lone graph another model of this shape compiled would run here.
        self._checked.add(key)
        with _freezing(graph == "lone"):  # a graph is compiled here when none fits
            return self._graphs[graph](token, position, **inputs)[:rows]

    def _lone_call(self, token: Tensor, position: Tensor, **inputs: Any) -> Tensor:
        """:meth:`step`, entered through a function of its own: PyTorch keeps compiled graphs
        per function, so the lone sentence's graph and the general one never take each
        other's place."""
        return self.step(token, position, **inputs)

    def step(
        self,
        token: Tensor,
        position: Tensor,
        *,
        self_k: list[Tensor],
        self_v: list[Tensor],
        cross_k: list[Tensor],
        cross_v: list[Tensor],
        src_mask: Tensor,
    ) -> Tensor:
        """The step as a function of tensors only (what ``torch.compile`` traces)."""
        decoder = self.model.decoder
        embedding = decoder.embedding
        # Embedding dropout is the identity in eval mode, as every dropout below.
        x = embedding.token(token) + embedding.position.at(position)  # (n, 1, d_model)
        seen = torch.arange(self_k[0].size(2), device=token.device) <= position  # (T_max,)
        seen = seen[None, None, None, :]  # (1, 1, 1, T_max)
        for i, layer in enumerate(decoder.layers):
            x = _layer_step(
                layer, x, position=position, seen=seen, self_kv=(self_k[i], self_v[i]),
                cross_kv=(cross_k[i], cross_v[i]), src_mask=src_mask,
            )  # fmt: skip
        logits = self.model.generator(decoder.norm(x))[:, -1]  # (n, V)
        return logits.float().log_softmax(dim=-1)


def _layer_step(
    layer: DecoderLayer,
    x: Tensor,
    *,
    position: Tensor,
    seen: Tensor,
    self_kv: tuple[Tensor, Tensor],
    cross_kv: tuple[Tensor, Tensor],
    src_mask: Tensor,
) -> Tensor:
    """:meth:`DecoderLayer.forward` for one cached position ``x (n, 1, d_model)``."""

    def self_attention(y: Tensor) -> Tensor:
        attn = layer.self_attn
        q, k, v = (
            attn._project(y, projection)[0]
            for projection in (attn.q_proj, attn.k_proj, attn.v_proj)
        )  # (n, H, 1, d_k / d_v) each
        k_buffer, v_buffer = self_kv
        k_buffer.index_copy_(2, position.view(1), k)  # position t of (n, H, T_max, d_k)
        v_buffer.index_copy_(2, position.view(1), v)
        return _attend(attn, q, k_buffer, v_buffer, seen)

    def cross_attention(y: Tensor) -> Tensor:
        attn = layer.cross_attn
        (q,) = attn._project(y, attn.q_proj)  # (n, H, 1, d_k)
        return _attend(attn, q, *cross_kv, src_mask)

    x = layer.sublayer1(x, self_attention)
    x = layer.sublayer2(x, cross_attention)
    return layer.sublayer3(x, layer.feed_forward)


def _attend(attn: MultiHeadAttention, q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> Tensor:
    """Equation (1) for one query per row, then the heads joined by ``W^O``: ``(n, 1, d_model)``."""
    out, _ = scaled_dot_product_attention(q, k, v, mask)  # (n, H, 1, d_v)
    n = out.size(0)
    return attn.out_proj(out.transpose(1, 2).reshape(n, 1, attn.n_heads * attn.d_v))


def _freezing(on: bool) -> contextlib.AbstractContextManager[Any]:
    """Inductor's ``freezing`` switched on globally while a graph may be compiled: Dynamo reads
    the global switch, not ``torch.compile``'s options, when it decides whether the weights
    become constants of the graph or stay its inputs."""
    return inductor_config.patch(freezing=True) if on else contextlib.nullcontext()
