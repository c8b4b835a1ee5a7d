"""Attention heatmaps of a checkpoint for one sentence, per layer and head.

    python scripts/plot_attention.py --ckpt run/checkpoints/last.ckpt \
        "I know that Anna has ninety-seven apples." -o attention/

Writes three PNG grids (rows = layers, columns = heads) with tokens on the axes:
``encoder_self.png`` (source x source), ``decoder_self.png`` (output x output) and
``cross.png`` (output x source: which source tokens each output token looks at; the German
verb-final "hat" should look at "has"). The sentence is translated greedily, then one
teacher-forced forward pass over the source and the generated output records every weight
(``transformer_mt.inference.attention_maps.record_maps``: the explicit attention math on
each layer's inputs, collected by forward hooks).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import matplotlib
import torch

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from transformer_mt.checkpoint import CheckpointError, LoadedModel, load_model, resolve_device
from transformer_mt.inference.attention_maps import KINDS, record_maps
from transformer_mt.inference.search import SearchConfig, search_batch


@torch.no_grad()
def attention_maps(
    loaded: LoadedModel, sentence: str, max_len_b: int = 10
) -> tuple[list[str], list[str], list[str], dict[str, list[torch.Tensor]], str]:
    """Translate ``sentence`` greedily and record every attention weight on the result.

    Returns:
        ``(src_labels, out_labels, in_labels, maps, translation)``: ``maps`` has keys
        ``encoder_self`` ``(H, S, S)``, ``decoder_self`` ``(H, T, T)``, ``cross`` ``(H, T, S)``
        per layer; output labels name the token predicted at each decoder position, input
        labels the token fed there (``<bos>`` + output).
    """
    tok = loaded.tokenizer
    src_ids = tok.encode_src_batch([sentence])[0][: loaded.config.max_len - 1]
    src = torch.tensor([[*src_ids, tok.eos_id]], device=loaded.device)  # (1, S)
    search = SearchConfig(beam_size=1, max_len_b=max_len_b)
    found = search_batch(loaded.model, src, bos_id=tok.bos_id, eos_id=tok.eos_id, search=search)
    out = found[0][0].tokens
    maps = record_maps(loaded, src_ids, out)
    weights = {kind: getattr(maps, kind) for kind in KINDS}
    translation = tok.decode_tgt_batch([out])[0]
    return maps.src_labels, maps.out_labels, maps.in_labels, weights, translation


def plot_grid(
    weights: list[torch.Tensor],
    row_labels: list[str],
    col_labels: list[str],
    title: str,
    output: Path,
    ylabel: str,
    xlabel: str,
    dpi: int = 80,
) -> Path:
    """One heatmap per (layer, head): rows = layers, columns = heads."""
    n_layers, n_heads = len(weights), weights[0].size(0)
    cell = 0.22  # inches per token
    w = max(2.5, cell * len(col_labels) + 1.2)
    h = max(2.5, cell * len(row_labels) + 1.2)
    fig, axes = plt.subplots(n_layers, n_heads, figsize=(w * n_heads, h * n_layers), squeeze=False)
    for layer, layer_weights in enumerate(weights):
        for head in range(n_heads):
            ax = axes[layer][head]
            ax.imshow(
                layer_weights[head].numpy(), cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto"
            )
            ax.set_xticks(range(len(col_labels)))
            ax.set_xticklabels(col_labels, rotation=90, fontsize=7)
            ax.set_yticks(range(len(row_labels)))
            ax.set_yticklabels(row_labels, fontsize=7)
            ax.set_title(f"layer {layer + 1}, head {head + 1}", fontsize=9)
            if head == 0:
                ax.set_ylabel(ylabel, fontsize=8)
            if layer == n_layers - 1:
                ax.set_xlabel(xlabel, fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    output.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(output, dpi=dpi)
    plt.close(fig)
    return output


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sentence", help="source sentence to translate and plot")
    parser.add_argument("--ckpt", required=True, help="checkpoint (.ckpt) written by train.py")
    parser.add_argument("-o", "--output-dir", default="attention", help="folder for the PNGs")
    parser.add_argument(
        "--only", choices=("encoder_self", "decoder_self", "cross"), help="plot one kind only"
    )
    parser.add_argument("--dpi", type=int, default=80, help="resolution of the PNGs")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, auto")
    args = parser.parse_args(argv)
    try:
        loaded = load_model(args.ckpt, resolve_device(args.device))
    except (CheckpointError, ValueError) as err:
        print(f"plot_attention: error: {err}", file=sys.stderr)
        return 1
    src, out, tgt_in, maps, translation = attention_maps(loaded, args.sentence)
    quote = f"{args.sentence!r} -> {translation!r}"
    kinds = {
        "encoder_self": (src, src, "encoder self-attention", "query (source)", "key (source)"),
        "decoder_self": (
            out,
            tgt_in,
            "decoder self-attention",
            "predicting",
            "key (output so far)",
        ),
        "cross": (out, src, "cross-attention", "predicting", "key (source)"),
    }
    out_dir = Path(args.output_dir)
    for kind, (rows, cols, name, ylabel, xlabel) in kinds.items():
        if args.only and kind != args.only:
            continue
        path = plot_grid(
            maps[kind],
            rows,
            cols,
            f"{name}: {quote}",
            out_dir / f"{kind}.png",
            ylabel,
            xlabel,
            args.dpi,
        )
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
