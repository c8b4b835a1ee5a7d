"""Write the committed record of a result: docs/runs/<name>.json.

Every number of the README's results table comes from one of these records, and
tests/test_records.py fails when the table and the records disagree. A record holds what it
takes to judge and repeat the number: the command, the git commit, the CPU model and threads,
the training (epochs, steps, median target tokens/s, the wall-clock budget), and for each
evaluation of the run the checkpoint, decoding options, metrics and sacreBLEU signatures (for
a multilingual model each direction's metrics too, the means as ``metrics``).

    python scripts/record_run.py RUN_DIR --name multi30k_de_en_60 \\
        --eval greedy=outputs/evaluate/greedy/results.json \\
        --eval beam5=outputs/evaluate/beam5/results.json

The machine, command and commit come from RUN_DIR/run_info.json (written by every run since
it existed); for an older run, state them with --commit, --command and --threads (the CPU
is then this machine's: record on the machine that trained). An existing record is
replaced only with --force.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from transformer_mt.files import write_text_atomic
from transformer_mt.provenance import RUN_INFO, machine

FORMAT = "transformer_mt.record"
RECORDS = Path(__file__).resolve().parents[1] / "docs" / "runs"


def training_facts(run_dir: Path) -> dict[str, Any]:
    """Epochs, steps, median target tokens/s and best validation BLEU from metrics.csv."""
    metrics = next(iter(sorted(run_dir.rglob("metrics.csv"))), None)
    if metrics is None:
        raise ValueError(f"{run_dir} has no metrics.csv; pass the run directory of train.py")
    with open(metrics, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    speeds = [float(r["train/tokens_per_sec"]) for r in rows if r.get("train/tokens_per_sec")]
    val = [(int(r["epoch"]), float(r["val/bleu"])) for r in rows if r.get("val/bleu")]
    steps = [int(r["step"]) for r in rows if r.get("step")]
    last = next((r for r in reversed(rows) if r.get("val/bleu")), {})
    return {
        # Perplexity per target subword token, of the plain NLL (no label smoothing).
        "last_validation": {
            k: round(float(last[f"val/{k}"]), 3) for k in ("bleu", "ppl") if last.get(f"val/{k}")
        },
        "epochs": max((e for e, _ in val), default=-1) + 1,  # validations at epoch ends
        "steps": max([*steps, final_step(run_dir)], default=0),
        "target_tokens_per_s_median": round(statistics.median(speeds)) if speeds else None,
        "validations": len(val),
        "best_val_bleu": round(max((b for _, b in val), default=float("nan")), 2),
    }


def final_step(run_dir: Path) -> int:
    """The global step of last.ckpt, or of the newest checkpoint where a run keeps no last.ckpt
    (a sweep's trial); 0 without any.

    metrics.csv has a row only every log_every_n_steps, so a run ended by
    trainer.max_steps can end up to that many steps after its last row; the checkpoint saved
    at the end holds the count itself.
    """
    from transformer_mt.checkpoint import load_checkpoint

    folder = run_dir / "checkpoints"
    saved = sorted(folder.glob("*.ckpt"), key=lambda p: (p.name == "last.ckpt", p.stat().st_mtime))
    return int(load_checkpoint(saved[-1]).get("global_step") or 0) if saved else 0


def run_settings(run_dir: Path) -> dict[str, Any]:
    """The budget and the composed config's key settings (.hydra/config.yaml)."""
    from omegaconf import OmegaConf

    path = run_dir / ".hydra" / "config.yaml"
    if not path.is_file():
        return {}
    cfg = OmegaConf.load(path)
    chosen = parameters = None
    log_file = run_dir / "train.log"
    if log_file.is_file():  # what trainer.precision=auto picked, as the run logged it
        for line in log_file.read_text(encoding="utf-8", errors="replace").splitlines():
            if "precision.py" in line or "- precision: " in line:
                chosen = line.split("precision: ", 1)[-1].strip()
            if "- model: " in line and " parameters " in line:
                parameters = int(line.split("- model: ", 1)[1].split()[0].replace(",", ""))
    overrides = run_dir / ".hydra" / "overrides.yaml"
    return {
        # A sweep's job differs from its command by these (its sampled or given point).
        "overrides": list(OmegaConf.load(overrides)) if overrides.is_file() else None,
        "parameters": parameters,
        "precision_chosen": chosen,
        "task_name": cfg.get("task_name"),
        "max_time": OmegaConf.select(cfg, "trainer.max_time"),
        "precision": OmegaConf.select(cfg, "trainer.precision"),
        "seed": cfg.get("seed"),
    }


def evaluation(path: Path) -> dict[str, Any]:
    results = json.loads(path.read_text(encoding="utf-8"))
    if "metrics" not in results:
        raise ValueError(f"{path} has no metrics: evaluate with references (a test split)")
    decoding = results["decoding"]
    keep = (
        "beam_size",
        "length_penalty",
        "length_norm",
        "nbest",
        "engine",
        "compute_type",
        "device",
    )
    per_direction = {
        name: {k: round(float(v), 2) for k, v in part["metrics"].items()}
        for name, part in (results.get("directions") or {}).items()
    }
    return {
        **({"directions": per_direction} if per_direction else {}),
        "checkpoint": Path(results["checkpoint"]["path"]).name,
        "global_step": results["checkpoint"].get("global_step"),
        "data": results.get("data", {}).get("split") or results.get("data", {}).get("source_file"),
        "decoding": {k: decoding.get(k) for k in keep},
        "metrics": {k: round(float(v), 2) for k, v in results["metrics"].items()},
        "signature": results.get("signature", {}),
        "sentences_per_s": results.get("sentences_per_s"),
    }


def build(args: argparse.Namespace) -> dict[str, Any]:
    run_dir = Path(args.run_dir)
    info_path = run_dir / RUN_INFO
    if info_path.is_file():
        starts = json.loads(info_path.read_text(encoding="utf-8"))["starts"]
        first = starts[0]
        source, where = first["source"], first["machine"]
        command = args.command or " ".join(["python", *first["argv"]])
    else:
        if not (args.commit and args.command):
            raise ValueError(
                f"{run_dir} has no {RUN_INFO} (a run from before it existed): state "
                "--commit and --command (and --threads), on the machine that trained it"
            )
        command = args.command
        source = {"commit": args.commit, "dirty": None}
        where = {**machine(), "threads": args.threads, "load_average": None}
    evaluations = {}
    for item in args.eval:
        name, sep, path = item.partition("=")
        if not sep or not name:
            raise ValueError(f"--eval {item!r}: give NAME=results.json")
        evaluations[name] = evaluation(Path(path))
    return {
        "format": FORMAT,
        "name": args.name,
        "command": command,
        "source": source,
        "machine": where,
        "quiet": args.quiet_note,
        "settings": run_settings(run_dir),
        "training": training_facts(run_dir),
        "evaluations": evaluations,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", help="the run directory train.py wrote")
    parser.add_argument("--name", required=True, help="the record's name: docs/runs/NAME.json")
    parser.add_argument("--eval", action="append", default=[], metavar="NAME=RESULTS_JSON")
    parser.add_argument("--commit", help="git commit the run started from (older runs)")
    parser.add_argument("--command", help="the command that started the run")
    parser.add_argument("--threads", type=int, help="torch threads of the run (older runs)")
    parser.add_argument(
        "--quiet-note", default="", help="how busy the machine was (e.g. 'quiet, load ~1.1')"
    )
    parser.add_argument("--out", type=Path, default=RECORDS, help="the records folder")
    parser.add_argument("--force", action="store_true", help="replace an existing record")
    args = parser.parse_args(argv)
    target = args.out / f"{args.name}.json"
    try:
        if target.exists():
            old = json.loads(target.read_text(encoding="utf-8"))
            if old.get("format") != FORMAT:
                raise ValueError(f"{target} exists and is not a record; choose another --name")
            if not args.force:
                raise ValueError(f"{target} exists; pass --force to replace the record")
        record = build(args)
    except (OSError, ValueError, KeyError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(target, json.dumps(record, indent=2, ensure_ascii=False) + "\n")
    print(target)
    return 0


if __name__ == "__main__":
    sys.exit(main())
