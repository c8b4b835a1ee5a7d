"""EMA vs the best checkpoint vs the average of the last N, chosen on validation, tested once.

    python scripts/compare_ema.py --ema-run RUN_EMA [--baseline-run RUN] --out DIR [--last 5]

Candidates, each decoded on the validation split with the checkpoint's stored decoding:

- from the run trained with ``callbacks=ema`` (its checkpoints hold the average as
  ``state_dict`` and the raw weights as ``current_model_state``): ``ema_best`` (the checkpoint
  chosen by the averaged weights' val/bleu), ``ema_last`` (the average at the end),
  ``ema_run_raw_last`` and ``ema_run_raw_avgN`` (the same run's raw weights: the last ones, and
  the average of the last N checkpoints) -- side by side within one run, so a wall-clock
  budget on a busy machine cannot favour one candidate;
- from a run without EMA, if given: ``baseline_best`` and ``baseline_avgN``.

The candidate with the highest validation BLEU is then decoded once on the test split. The
table goes to stdout with the CPU model, the JSON (every result) to ``DIR/compare_ema.json``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir

from average_checkpoints import select_checkpoints  # scripts/average_checkpoints.py
from bench.common import cpu_model
from transformer_mt.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from transformer_mt.cli.evaluate import evaluate
from transformer_mt.cli.hydra_app import register_configs
from transformer_mt.errors import EXIT_USER_ERROR, one_line
from transformer_mt.inference.averaging import average_checkpoints

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
log = logging.getLogger("compare_ema")


def raw_weights(path: Path, out: Path) -> Path:
    """A checkpoint of ``path``'s raw (non-averaged) weights, written to ``out``."""
    checkpoint = load_checkpoint(path)
    if "current_model_state" not in checkpoint:
        raise CheckpointError(
            f"{path} holds no current_model_state: it was not trained with callbacks=ema; pass "
            "the run trained with EMA as --ema-run"
        )
    checkpoint["state_dict"] = checkpoint.pop("current_model_state")
    for key in ("averaging_state", "optimizer_states", "lr_schedulers", "callbacks", "loops"):
        checkpoint.pop(key, None)  # an evaluation copy: it does not resume
    return save_checkpoint(checkpoint, out)


def best_path(run_dir: Path) -> Path:
    return select_checkpoints(run_dir, 1, "best")[0]


def candidates(args: argparse.Namespace) -> dict[str, Path]:
    """The checkpoints to compare, written under ``args.out`` where they are derived."""
    out, n = args.out, args.last
    ema_dir = args.ema_run
    lasts = select_checkpoints(ema_dir, n, "last")
    raw = [raw_weights(p, out / "ckpt" / f"raw-{p.name}") for p in lasts]
    found = {
        "ema_best": best_path(ema_dir),
        "ema_last": lasts[0],
        "ema_run_raw_last": raw[0],
        f"ema_run_raw_avg{n}": save_checkpoint(
            average_checkpoints(raw), out / "ckpt" / f"ema_run_raw_avg{n}.ckpt"
        ),
    }
    if args.baseline_run is not None:
        found["baseline_best"] = best_path(args.baseline_run)
        found[f"baseline_avg{n}"] = save_checkpoint(
            average_checkpoints(select_checkpoints(args.baseline_run, n, "last")),
            out / "ckpt" / f"baseline_avg{n}.ckpt",
        )
    return found


def score(ckpt: Path, split: str, out: Path, threads: int | None) -> dict[str, Any]:
    overrides = [f"ckpt_path={ckpt}", f"split={split}", f"run_dir={out}", "progress=false"]
    if threads:
        overrides.append(f"threads={threads}")
    register_configs()  # evaluate.yaml's data=stored, as the evaluate command registers it
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        return evaluate(compose("evaluate", overrides=overrides))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ema-run", type=Path, required=True, help="run dir of callbacks=ema")
    parser.add_argument("--baseline-run", type=Path, help="run dir of the same preset without EMA")
    parser.add_argument("--out", type=Path, required=True, help="where results and copies go")
    parser.add_argument("--last", type=int, default=5, help="N of the average of the last N")
    parser.add_argument("--threads", type=int, default=None, help="torch threads")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    try:
        found = candidates(args)
        val = {
            name: score(path, "validation", args.out / name / "validation", args.threads)
            for name, path in found.items()
        }
    except (CheckpointError, OSError) as err:
        print(f"error: {one_line(err)}", file=sys.stderr)
        return EXIT_USER_ERROR
    winner = max(val, key=lambda name: val[name]["metrics"]["bleu"])
    test = score(found[winner], "test", args.out / winner / "test", args.threads)
    cpu = cpu_model()
    load = os.getloadavg()[0]
    print(f"CPU: {cpu}; load average {load:.1f} (a shared machine slows decoding, not BLEU)")
    print(f"{'candidate':<22} {'val BLEU':>9} {'val chrF':>9}  checkpoint")
    for name, res in val.items():
        m = res["metrics"]
        print(f"{name:<22} {m['bleu']:>9.2f} {m['chrf']:>9.2f}  {found[name]}")
    print(
        f"chosen on validation: {winner}; test BLEU {test['metrics']['bleu']:.2f}, "
        f"chrF {test['metrics']['chrf']:.2f} (decoding: beam {test['decoding']['beam_size']})"
    )
    report = {
        "cpu": cpu,
        "load_average": load,
        "candidates": {name: str(path) for name, path in found.items()},
        "validation": {name: res["metrics"] for name, res in val.items()},
        "chosen": winner,
        "test": {"candidate": winner, **test["metrics"], "signature": test.get("signature")},
    }
    (args.out / "compare_ema.json").write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
