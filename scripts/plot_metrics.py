"""Learning curves of a run: train/val loss, val BLEU and learning rate against steps.

    python scripts/plot_metrics.py RUN_DIR [-o RUN_DIR/metrics.png]

Reads the CSV logger's ``RUN_DIR/csv/metrics.csv`` (or a metrics.csv given directly).
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

PANELS = (
    ("loss", ("train/loss", "val/loss")),
    ("BLEU", ("val/bleu", "test/bleu")),
    ("learning rate", ("train/lr", "lr-AdamW", "lr-Adam")),
)


def read_metrics(path: Path) -> dict[str, list[tuple[int, float]]]:
    """``metric -> [(step, value), ...]`` from a Lightning CSV log (blank cells skipped)."""
    series: dict[str, list[tuple[int, float]]] = defaultdict(list)
    with open(path, newline="", encoding="utf-8") as f:
        for row in csv.DictReader(f):
            step_text = row.get("step") or ""
            if not step_text:
                continue
            step = int(float(step_text))
            for key, text in row.items():
                if key in ("step", "epoch") or not text:
                    continue
                try:
                    value = float(text)
                except ValueError:
                    continue
                if math.isfinite(value):
                    series[key].append((step, value))
    return dict(series)


def plot(series: dict[str, list[tuple[int, float]]], output: Path, title: str = "") -> Path:
    """Three panels (loss, BLEU, learning rate) as one PNG."""
    fig, axes = plt.subplots(1, 3, figsize=(14, 3.8))
    for ax, (label, keys) in zip(axes, PANELS):
        for key in keys:
            if key in series:
                steps, values = zip(*series[key])
                ax.plot(steps, values, marker="o" if len(steps) < 30 else None, ms=3, label=key)
        ax.set_xlabel("step")
        ax.set_title(label)
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=8)
        else:
            ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    output.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(output, dpi=100)
    plt.close(fig)
    return output


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", help="run directory (holds csv/metrics.csv) or a metrics.csv")
    parser.add_argument("-o", "--output", help="PNG path (default: RUN_DIR/metrics.png)")
    args = parser.parse_args(argv)
    run = Path(args.run)
    csv_path = run if run.is_file() else run / "csv" / "metrics.csv"
    if not csv_path.is_file():
        print(
            f"plot_metrics: error: {csv_path} does not exist; pass a run directory trained "
            "with the CSV logger (logger=csv, the default)",
            file=sys.stderr,
        )
        return 1
    series = read_metrics(csv_path)
    output = Path(args.output) if args.output else csv_path.parent.parent / "metrics.png"
    print(plot(series, output, title=str(csv_path.parent.parent)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
