"""Training-loop benchmark: the bare model step vs the real Trainer loop vs nn.Transformer.

Three ways to train on the *same* batches, measured side by side in one process:

bare            our ``Transformer``: forward, the project's label-smoothed loss, backward,
                gradient clipping (1.0), fused AdamW step. Pre-collated batches, no Lightning.
real            ``lightning.pytorch.Trainer`` through ``TranslationModule``, built by
                ``training.run.prepare_and_build`` from the preset (callbacks, loggers, progress
                bar and ``log_every_n_steps`` as configured), reading batches through the real data
                module (collate included); validation off.
nn.Transformer  ``torch.nn.Transformer`` of the same size in the bare step (fp32 only), with
                our embeddings and tied generator (:class:`bench.common.TorchTransformerMT`).

Each precision in ``--precisions`` gets a bare and a real row (``32-true``, ``bf16-mixed``,
``bf16-true``: Lightning's names). The contenders are interleaved (every repeat runs each once,
in a rotating order) so drift of a shared machine hits all of them alike; a contender's figure
is the median over repeats of its target tokens/s (non-pad target tokens of steps after the
warmup / their wall time, data loading and logging included for the real loop). The
``real/bare`` ratio is taken per repeat and its median reported.

Data: the Multi30k preset (``experiment=multi30k_de_en data.source=files``: its model, vocab
6000, token-budget batches; the JSON records the sizes) when the shared data is
present, else the generated ``numbers`` corpus with the same model sizes (its vocabulary is
smaller: the JSON says which). ``--quick`` shrinks model and data to a smoke test.

    python scripts/benchmark.py loop --out docs/benchmarks/loop.json
    python scripts/benchmark.py loop --precisions 32-true --repeats 5 --out /tmp/loop.json
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from bench.common import Table, TorchTransformerMT, environment, goal

NAME = "loop"
HELP = "training tokens/s: bare step vs the real Trainer loop vs nn.Transformer"
ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "configs"
#: Where configs/data/multi30k.yaml looks (../shared/data/multi30k from the project root).
MULTI30K = (ROOT / ".." / "shared" / "data" / "multi30k").resolve()
PRECISIONS = ("32-true", "bf16-mixed", "bf16-true")

log = logging.getLogger("bench.loop")

#: One timed run of a contender: (seconds, target tokens) of the steps after the warmup.
Contender = Callable[[], tuple[float, int]]


def add_step_arguments(p: argparse.ArgumentParser) -> None:
    """Steps, repeats and data: shared with ``loop-threads``."""
    p.add_argument("--steps", type=int, default=24, help="training steps per timed run")
    p.add_argument("--warmup", type=int, default=4, help="untimed steps at the start of each run")
    p.add_argument("--repeats", type=int, default=3, help="interleaved repeats (median)")
    p.add_argument(
        "--data",
        choices=["auto", "multi30k", "generated"],
        default="auto",
        help="auto: Multi30k files when present, else the generated corpus",
    )
    p.add_argument("--data-dir", type=Path, default=MULTI30K)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of ``benchmark.py loop``."""
    add_step_arguments(p)
    p.add_argument("--precisions", nargs="+", default=["32-true", "bf16-mixed"], choices=PRECISIONS)
    p.add_argument("--no-torch", action="store_true", help="skip the nn.Transformer row")
    p.add_argument("--bare-only", action="store_true", help="only the bare-step rows")
    p.add_argument("--no-real", action="store_true", help="skip the real Trainer loop rows")
    p.add_argument("--accelerator", default="cpu", help="cpu (default), gpu or auto")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--override", nargs="*", default=[], help="extra Hydra overrides for the config")


def check_steps(args: argparse.Namespace) -> None:
    """Refuse a window with no timed step; resolve ``--data auto``."""
    if args.warmup >= args.steps:
        raise ValueError(
            f"--warmup ({args.warmup}) must be below --steps ({args.steps}); "
            "lower --warmup or raise --steps"
        )
    if args.data == "auto":
        args.data = "multi30k" if (args.data_dir / "train.de.gz").is_file() else "generated"


# ------------------------------------------------------------------------------ config + data

#: The preset's model and trainer on the generated corpus (when Multi30k is absent).
GENERATED = [
    "data=numbers",
    "model=small",
    "model.d_ff=512",
    "model.dropout=0.2",
    "trainer=cpu",
    "trainer.log_every_n_steps=25",
    "module.lr_schedule=linear",
]
#: What ``--quick`` shrinks.
QUICK_MODEL = [
    "model.d_model=32",
    "model.n_heads=2",
    "model.d_ff=64",
    "model.n_encoder_layers=1",
    "model.n_decoder_layers=1",
    "data.max_tokens=512",
]
QUICK_GENERATED = ["data.sizes.train=600", "data.vocab_size=300", "data.cache_dir=null"]


def compose_config(args: argparse.Namespace, run_dir: Path, precision: str) -> Any:
    """The training config the real loop runs: the preset, validation and tests off."""
    from hydra import compose, initialize_config_dir

    from transformer_mt.cli.hydra_app import register_configs

    multi30k = args.data == "multi30k"
    overrides = (
        ["experiment=multi30k_de_en", "data.source=files", f"data.dir={args.data_dir}"]
        if multi30k
        else list(GENERATED)
    )
    overrides += [
        f"run_dir={run_dir}",
        f"trainer.precision={precision}",
        "trainer.max_epochs=1",
        # One step more than timed: the window ends where the step after the last timed one
        # starts, so end-of-fit work (a final checkpoint) stays outside it.
        f"trainer.max_steps={args.steps + 1}",
        "trainer.limit_val_batches=0",
        "trainer.num_sanity_val_steps=0",
        "test_after_fit=false",
        # The preset's decaying schedules need a horizon longer than the warmup.
        "module.warmup_steps=1",
        f"seed={args.seed}",
    ]
    if args.accelerator != "auto":
        overrides.append(f"trainer.accelerator={args.accelerator}")
    if args.quick:
        overrides += QUICK_MODEL + ([] if multi30k else QUICK_GENERATED)
    overrides += args.override
    register_configs()  # train.yaml's schema, as the train command registers it
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        return compose("train", overrides=overrides)


def first_batches(datamodule: Any, n: int, device: torch.device) -> list[dict[str, Tensor]]:
    """The first ``n`` training batches of epoch 0: what the real loop will read first."""
    batches = []
    for batch in datamodule.train_dataloader():
        batches.append({k: batch[k].to(device) for k in ("src", "tgt")})
        if len(batches) == n:
            break
    return batches


def target_tokens(batch: dict[str, Any], pad_id: int) -> int:
    return int((batch["tgt"][:, 1:] != pad_id).sum())


# ------------------------------------------------------------------------------ bare step


def _optimizer(model: nn.Module, cfg: Any) -> torch.optim.Optimizer:
    """AdamW with the configured settings (what the real loop's optimizer gets)."""
    opt = cfg.optimizer
    return torch.optim.AdamW(
        model.parameters(),
        lr=float(opt.lr),
        betas=tuple(opt.betas),
        eps=float(opt.eps),
        weight_decay=float(opt.weight_decay),
        fused=bool(opt.get("fused", True)),
    )


def bare_runner(
    model: nn.Module, cfg: Any, pad_id: int, precision: str, device: torch.device
) -> Callable[[list[dict[str, Tensor]]], None]:
    """A function that trains ``model`` on a list of batches with the plainest possible loop."""
    from transformer_mt.training.loss import label_smoothed_loss

    model = model.to(device).train()
    if precision == "bf16-true":
        model = model.to(torch.bfloat16)
    optimizer = _optimizer(model, cfg)
    clip = float(cfg.trainer.gradient_clip_val or 0.0)
    smoothing = float(cfg.module.label_smoothing)
    autocast: Callable[[], Any] = (
        (lambda: torch.autocast(device.type, dtype=torch.bfloat16))
        if precision == "bf16-mixed"
        else contextlib.nullcontext
    )

    def loss_of(batch: dict[str, Tensor]) -> Tensor:
        tgt = batch["tgt"]
        with autocast():
            logits = model(batch["src"], tgt[:, :-1])  # (B, T, V)
        return label_smoothed_loss(logits, tgt[:, 1:], pad_id, smoothing)[0]

    def train(batches: list[dict[str, Tensor]]) -> None:
        for batch in batches:
            loss = loss_of(batch)
            loss.backward()
            if clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    return train


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def time_bare(
    train: Callable[[list[dict[str, Tensor]]], None],
    batches: list[dict[str, Tensor]],
    warmup: int,
    device: torch.device,
) -> float:
    """Seconds for the batches after the first ``warmup`` (which run untimed first)."""
    train(batches[:warmup])
    _sync(device)
    start = time.perf_counter()
    train(batches[warmup:])
    _sync(device)
    return time.perf_counter() - start


# ------------------------------------------------------------------------------ real loop


def _batch_hooks(starts: list[float], tokens: list[int], pad_id: int) -> Any:
    """A callback noting when each training batch starts and its target tokens."""
    import lightning.pytorch as pl

    class _Clock(pl.Callback):
        def on_train_batch_start(self, trainer: Any, module: Any, batch: Any, i: int) -> None:
            _sync(module.device)
            starts.append(time.perf_counter())
            tokens.append(target_tokens(batch, pad_id))

    return _Clock()


def time_real(args: argparse.Namespace, precision: str, run_dir: Path) -> tuple[float, int]:
    """One real fit of ``args.steps`` steps; seconds and target tokens after the warmup.

    The window runs from the start of batch ``warmup`` to the start of batch ``steps`` (the
    fit runs one more), so the data loader, logging and everything else Lightning does
    between two steps is inside it, and nothing done once at the end of a fit is.
    """
    from transformer_mt.training.run import prepare_and_build

    cfg = compose_config(args, run_dir, precision)
    with _quiet():
        datamodule, module, trainer = prepare_and_build(cfg)
    starts: list[float] = []
    tokens: list[int] = []
    trainer.callbacks.append(_batch_hooks(starts, tokens, module.config.pad_id))
    with _quiet():
        trainer.fit(module, datamodule=datamodule)
    if len(starts) != args.steps + 1:
        raise RuntimeError(f"the real loop ran {len(starts)} steps, expected {args.steps + 1}")
    return starts[args.steps] - starts[args.warmup], sum(tokens[args.warmup : args.steps])


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Lightning's info lines (and the rich progress bar) off the benchmark's own output."""
    names = ("lightning.pytorch", "lightning.fabric", "transformer_mt")
    levels = {n: logging.getLogger(n).level for n in names}
    for n in names:
        logging.getLogger(n).setLevel(logging.WARNING)
    try:
        with (
            open(os.devnull, "w") as devnull,
            contextlib.redirect_stdout(devnull),
            warnings.catch_warnings(),
        ):
            warnings.simplefilter("ignore")
            yield
    finally:
        for n, level in levels.items():
            logging.getLogger(n).setLevel(level)


# ------------------------------------------------------------------------------ driver


def precision_supported(precision: str, device: torch.device) -> str | None:
    """Why ``precision`` cannot run here (None when it can)."""
    if precision == "32-true" or device.type != "cuda":
        # CPUs run bf16 everywhere (slowly without bf16 units: that is what we measure).
        return None
    return None if torch.cuda.is_bf16_supported() else "this GPU has no bf16"


def _device(accelerator: str) -> torch.device:
    if accelerator in ("gpu", "cuda") or (accelerator == "auto" and torch.cuda.is_available()):
        return torch.device("cuda")
    return torch.device("cpu")


class _Setup:
    """What every contender shares: the config, the batches and their token counts."""

    def __init__(self, args: argparse.Namespace, device: torch.device) -> None:
        from transformer_mt.training.run import prepare_and_build

        self.work = Path(tempfile.mkdtemp(prefix="bench_loop_"))
        # One run directory for every fit: the tokenizer is trained once and reused.
        self.cfg = compose_config(args, self.work / "run", "32-true")
        with _quiet():
            datamodule, module, _ = prepare_and_build(self.cfg)
        self.config = module.config
        self.pad_id = module.config.pad_id
        self.batches = first_batches(datamodule, args.steps, device)  # the real loop reads these
        self.tokens = [target_tokens(b, self.pad_id) for b in self.batches]
        self.timed_tokens = sum(self.tokens[args.warmup :])


def contenders(
    args: argparse.Namespace, setup: _Setup, precisions: list[str], device: torch.device
) -> dict[str, Contender]:
    """``"<kind> <precision>"`` -> one timed run, in the order of the table."""
    from transformer_mt.model.transformer import Transformer

    def bare(model: nn.Module, precision: str) -> Contender:
        train = bare_runner(model, setup.cfg, setup.pad_id, precision, device)
        return lambda: (time_bare(train, setup.batches, args.warmup, device), setup.timed_tokens)

    def real(precision: str) -> Contender:
        def go() -> tuple[float, int]:
            seconds, n = time_real(args, precision, setup.work / "run")
            if n != setup.timed_tokens:  # the comparison is only fair on the same batches
                raise RuntimeError(
                    f"real loop saw {n} target tokens, the bare {setup.timed_tokens}"
                )
            return seconds, n

        return go

    runs: dict[str, Contender] = {}
    for precision in precisions:
        torch.manual_seed(args.seed)
        runs[f"bare {precision}"] = bare(Transformer(setup.config), precision)
        if not (args.bare_only or args.no_real):
            runs[f"real {precision}"] = real(precision)
    if "32-true" in precisions and not args.no_torch and not args.bare_only:
        torch.manual_seed(args.seed)
        runs["nn.Transformer 32-true"] = bare(TorchTransformerMT(setup.config), "32-true")
    return runs


def interleaved_rates(runs: dict[str, Contender], repeats: int) -> dict[str, list[float]]:
    """Tokens/s of each contender per repeat, the order rotating from repeat to repeat."""
    names = list(runs)
    rates: dict[str, list[float]] = {n: [] for n in names}
    for r in range(repeats):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            seconds, n = runs[name]()
            rates[name].append(n / seconds)
            log.info("repeat %d %-24s %8.0f tok/s", r + 1, name, n / seconds)
    return rates


def median_ratio(rates: dict[str, list[float]], name: str, base: str) -> float:
    """The median over repeats of ``name``'s rate / ``base``'s rate in the same repeat."""
    return statistics.median(a / b for a, b in zip(rates[name], rates[base]))


def rows_from(rates: dict[str, list[float]]) -> list[dict[str, Any]]:
    """One row per contender: median tokens/s and the medians of its per-repeat ratios."""
    rows = []
    for name, values in rates.items():
        kind, precision = name.rsplit(" ", 1)
        row: dict[str, Any] = {
            "contender": kind,
            "precision": precision,
            "tokens_per_s": statistics.median(values),
            "tokens_per_s_all": values,
        }
        same = f"bare {precision}"
        if name != same and same in rates:
            row["vs_bare_same_precision"] = median_ratio(rates, name, same)
        if "bare 32-true" in rates and name != "bare 32-true":
            row["vs_bare_fp32"] = median_ratio(rates, name, "bare 32-true")
        rows.append(row)
    return rows


def goals(rates: dict[str, list[float]]) -> list[dict[str, Any]]:
    """Issue 31's training goals that this run's contenders can speak to (medians of ratios).

    The bf16 goal is stated for the preset's 60-minute run; the loop's batches measure the step
    (the real loop's rows when present), which has read higher than whole runs (docs/benchmarks.md).
    """
    found = []
    if "bare 32-true" in rates and "nn.Transformer 32-true" in rates:
        found.append(
            goal(
                "training step >= 1.5x nn.Transformer (fp32, same batches)",
                median_ratio(rates, "bare 32-true", "nn.Transformer 32-true"),
                1.5,
            )
        )
    kind = "real" if "real bf16-mixed" in rates and "real 32-true" in rates else "bare"
    if f"{kind} bf16-mixed" in rates and f"{kind} 32-true" in rates:
        found.append(
            goal(
                f"bf16-mixed >= 1.3x fp32 tokens/s ({kind} loop; the goal is the 60-minute run's)",
                median_ratio(rates, f"{kind} bf16-mixed", f"{kind} 32-true"),
                1.3,
            )
        )
    return found


def run(args: argparse.Namespace) -> dict[str, Any]:
    """The loop benchmark (the module docstring); its JSON result."""
    check_steps(args)
    device = _device(args.accelerator)
    setup = _Setup(args, device)
    precisions = [p for p in args.precisions if precision_supported(p, device) is None]
    skipped = {p: precision_supported(p, device) for p in args.precisions if p not in precisions}
    rates = interleaved_rates(contenders(args, setup, precisions, device), args.repeats)
    return {
        "benchmark": "loop",
        "settings": {
            "data": args.data,
            "model": setup.config.to_dict(),
            "steps": args.steps,
            "warmup_steps": args.warmup,
            "repeats": args.repeats,
            "target_tokens_per_batch": setup.tokens,
            "max_tokens": int(setup.cfg.data.max_tokens),
            "overrides": list(args.override),
            "log_every_n_steps": int(setup.cfg.trainer.log_every_n_steps),
            "device": str(device),
            "quick": args.quick,
            "skipped_precisions": skipped,
        },
        "rows": rows_from(rates),
        "goals": goals(rates),
        "environment": environment(),
    }


def tables(result: dict[str, Any]) -> list[Table]:
    settings = result["settings"]
    title = (
        f"Training loop, target tokens/s: {settings['steps']} steps "
        f"({settings['warmup_steps']} warmup) x {settings['repeats']} repeats, "
        f"data {settings['data']}, {settings['device']}"
    )
    header = ["contender", "precision", "tok/s (median)", "vs bare (same)", "vs bare fp32"]
    rows = []
    for row in result["rows"]:
        same, fp32 = row.get("vs_bare_same_precision"), row.get("vs_bare_fp32")
        rows.append(
            [
                row["contender"],
                row["precision"],
                f"{row['tokens_per_s']:,.0f}",
                f"{same:.2f}x" if same else "",
                f"{fp32:.2f}x" if fp32 else "",
            ]
        )
    for precision, why in settings["skipped_precisions"].items():
        rows.append(["skipped", precision, why, "", ""])
    return [(title, header, rows)]
