"""Lean-loop benchmark: the bare model step vs the real Trainer loop vs nn.Transformer.

Three ways to train on the *same* batches, measured side by side in one process:

bare            our ``Transformer``: forward, the project's label-smoothed loss, backward,
                gradient clipping (1.0), fused AdamW step. Pre-collated batches, no Lightning.
real            ``lightning.pytorch.Trainer`` through ``TranslationModule``, built by
                ``training.run.build`` from the preset (callbacks, loggers, progress bar and
                ``log_every_n_steps`` as configured), reading batches through the real data
                module (collate included); validation off.
nn.Transformer  ``torch.nn.Transformer`` of the same size in the bare step (fp32 only).

Each precision in ``--precisions`` gets a bare and a real row (``32-true``, ``bf16-mixed``,
``bf16-true``: Lightning's names). The contenders are interleaved (every repeat runs each once,
in a rotating order) so drift of a shared machine hits all of them alike; a contender's figure
is the median over repeats of its target tokens/s (non-pad target tokens of steps after the
warmup / their wall time, data loading and logging included for the real loop). The
``real/bare`` ratio is taken per repeat and its median reported.

Data: the Multi30k preset (``experiment=multi30k_de_en data.source=files``: small model,
d_ff 512, pre-LN, dropout 0.2, vocab 6000, token-budget batches) when the shared data is
present, else the generated ``numbers`` corpus with the same model sizes (its vocabulary is
smaller: the JSON says which). ``--quick`` shrinks everything to a smoke test.

    python scripts/bench_loop.py                       # table + docs/benchmarks/loop.json
    python scripts/bench_loop.py --precisions 32-true --repeats 5 --out /tmp/loop.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import platform
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"
# Where configs/data/multi30k.yaml looks (../shared/data/multi30k from the project root).
MULTI30K = (ROOT / ".." / "shared" / "data" / "multi30k").resolve()
PRECISIONS = ("32-true", "bf16-mixed", "bf16-true")

log = logging.getLogger("bench_loop")


# ------------------------------------------------------------------------------ environment


def cpu_model() -> str:
    """The CPU model string (what ``lscpu | grep 'Model name'`` prints)."""
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def environment() -> dict[str, Any]:
    """What the numbers were measured on, thread settings included."""
    return {
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "intra_op_threads": torch.get_num_threads(),
        "inter_op_threads": torch.get_num_interop_threads(),
        "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY"),
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
        "load_average": list(os.getloadavg()),
        "time_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
    }


# ------------------------------------------------------------------------------ config + data


def compose_config(args: argparse.Namespace, run_dir: Path, precision: str) -> Any:
    """The training config the real loop runs: the preset, validation and tests off."""
    from hydra import compose, initialize_config_dir

    if args.data == "multi30k":
        overrides = [
            "experiment=multi30k_de_en",
            "data.source=files",
            f"data.dir={args.data_dir}",
        ]
    else:  # generated corpus, the preset's model and trainer
        overrides = [
            "data=numbers",
            "model=small",
            "model.d_ff=512",
            "model.dropout=0.2",
            "trainer=cpu",
            "trainer.log_every_n_steps=25",
            "module.lr_schedule=linear",
        ]
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
        overrides += [
            "model.d_model=32",
            "model.n_heads=2",
            "model.d_ff=64",
            "model.n_encoder_layers=1",
            "model.n_decoder_layers=1",
            "data.max_tokens=512",
        ]
        if args.data != "multi30k":
            overrides += ["data.sizes.train=600", "data.vocab_size=300", "data.cache_dir=null"]
    overrides += args.override
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


# ------------------------------------------------------------------------------ contenders


class TorchTransformerMT(nn.Module):
    """``nn.Transformer`` between the same kind of embeddings and a tied output projection."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        c = config
        self.embedding = nn.Embedding(c.src_vocab_size, c.d_model, padding_idx=c.pad_id)
        self.scale = c.d_model**0.5
        position = torch.arange(c.max_len)[:, None]
        freq = torch.exp(
            torch.arange(0, c.d_model, 2) * (-torch.log(torch.tensor(1e4)) / c.d_model)
        )
        pe = torch.zeros(c.max_len, c.d_model)
        pe[:, 0::2], pe[:, 1::2] = torch.sin(position * freq), torch.cos(position * freq)
        self.register_buffer("pe", pe, persistent=False)
        self.dropout = nn.Dropout(c.dropout)
        self.transformer = nn.Transformer(
            d_model=c.d_model,
            nhead=c.n_heads,
            num_encoder_layers=c.n_encoder_layers,
            num_decoder_layers=c.n_decoder_layers,
            dim_feedforward=c.d_ff,
            dropout=c.dropout,
            activation=c.activation,
            batch_first=True,
            norm_first=c.norm_first,
        )
        self.generator = nn.Linear(c.d_model, c.tgt_vocab_size, bias=False)
        self.generator.weight = self.embedding.weight
        self.pad_id = c.pad_id

    def _embed(self, ids: Tensor) -> Tensor:
        return self.dropout(self.embedding(ids) * self.scale + self.pe[: ids.size(1)])

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        src_pad = src == self.pad_id  # (B, S), True = ignore (nn.Transformer's polarity)
        causal = nn.Transformer.generate_square_subsequent_mask(tgt_in.size(1), device=src.device)
        h = self.transformer(
            self._embed(src),
            self._embed(tgt_in),
            tgt_mask=causal,
            src_key_padding_mask=src_pad,
            memory_key_padding_mask=src_pad,
            tgt_is_causal=True,
        )
        return self.generator(h)  # (B, T, V)


def bare_runner(
    model: nn.Module, cfg: Any, pad_id: int, precision: str, device: torch.device
) -> Callable[[list[dict[str, Tensor]]], None]:
    """A function that trains ``model`` on a list of batches with the plainest possible loop."""
    from transformer_mt.training.loss import label_smoothed_loss

    model = model.to(device).train()
    if precision == "bf16-true":
        model = model.to(torch.bfloat16)
    opt = cfg.optimizer
    optimizer = torch.optim.AdamW(
        model.parameters(),
        lr=float(opt.lr),
        betas=tuple(opt.betas),
        eps=float(opt.eps),
        weight_decay=float(opt.weight_decay),
        fused=bool(opt.get("fused", True)),
    )
    clip = float(cfg.trainer.gradient_clip_val or 0.0)
    smoothing = float(cfg.module.label_smoothing)
    autocast: Callable[[], Any] = (
        (lambda: torch.autocast(device.type, dtype=torch.bfloat16))
        if precision == "bf16-mixed"
        else contextlib.nullcontext
    )

    def train(batches: list[dict[str, Tensor]]) -> None:
        for batch in batches:
            tgt = batch["tgt"]
            with autocast():
                logits = model(batch["src"], tgt[:, :-1])  # (B, T, V)
            loss, _, _ = label_smoothed_loss(logits, tgt[:, 1:], pad_id, smoothing)
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


class StepClock:
    """A callback noting when each training batch starts."""

    def __init__(self) -> None:
        self.starts: list[float] = []

    def hooks(self) -> Any:
        import lightning.pytorch as pl

        clock = self

        class _Clock(pl.Callback):
            def on_train_batch_start(self, trainer: Any, module: Any, batch: Any, i: int) -> None:
                _sync(module.device)
                clock.starts.append(time.perf_counter())

        return _Clock()


def time_real(args: argparse.Namespace, precision: str, run_dir: Path) -> tuple[float, int, Any]:
    """One real fit of ``args.steps`` steps; seconds and tokens after the warmup, and the cfg.

    The window runs from the start of batch ``warmup`` to the start of batch ``steps`` (the
    fit runs one more), so the data loader, logging and everything else Lightning does
    between two steps is inside it, and nothing done once at the end of a fit is.
    """
    from transformer_mt.training.run import build

    cfg = compose_config(args, run_dir, precision)
    with _quiet():
        datamodule, module, trainer = build(cfg)
    clock = StepClock()
    trainer.callbacks.append(clock.hooks())
    counted: list[int] = []
    loader_tokens = _TokenCounter(module.config.pad_id, counted)
    trainer.callbacks.append(loader_tokens.hooks())
    with _quiet():
        trainer.fit(module, datamodule=datamodule)
    starts = clock.starts
    if len(starts) != args.steps + 1:
        raise RuntimeError(f"the real loop ran {len(starts)} steps, expected {args.steps + 1}")
    seconds = starts[args.steps] - starts[args.warmup]
    return seconds, sum(counted[args.warmup : args.steps]), cfg


class _TokenCounter:
    """Counts target tokens of the batches the real loop trained on (same rule as the bare)."""

    def __init__(self, pad_id: int, out: list[int]) -> None:
        self.pad_id, self.out = pad_id, out

    def hooks(self) -> Any:
        import lightning.pytorch as pl

        counter = self

        class _Count(pl.Callback):
            def on_train_batch_start(self, trainer: Any, module: Any, batch: Any, i: int) -> None:
                counter.out.append(target_tokens(batch, counter.pad_id))

        return _Count()


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
    if precision == "32-true":
        return None
    if device.type == "cuda":
        return None if torch.cuda.is_bf16_supported() else "this GPU has no bf16"
    return None  # CPUs run bf16 everywhere (slowly without bf16 units: that is what we measure)


def run(args: argparse.Namespace) -> dict[str, Any]:
    torch.set_num_threads(args.threads)
    device = torch.device("cuda" if args.accelerator in ("gpu", "cuda") else "cpu")
    if args.accelerator == "auto" and torch.cuda.is_available():
        device = torch.device("cuda")
    from transformer_mt.model.transformer import Transformer
    from transformer_mt.training.run import build

    work = Path(tempfile.mkdtemp(prefix="bench_loop_"))
    # One run directory for every fit: the tokenizer is trained once and reused.
    cfg = compose_config(args, work / "run", "32-true")
    with _quiet():
        datamodule, module, _ = build(cfg)
    pad_id = module.config.pad_id
    batches = first_batches(datamodule, args.steps, device)  # the real loop reads the same
    tokens = [target_tokens(b, pad_id) for b in batches]
    timed_tokens = sum(tokens[args.warmup :])
    config = module.config
    del module

    precisions = [p for p in args.precisions if precision_supported(p, device) is None]
    skipped = {p: precision_supported(p, device) for p in args.precisions if p not in precisions}
    contenders: dict[str, Callable[[int], tuple[float, int]]] = {}

    def bare(precision: str) -> Callable[[int], tuple[float, int]]:
        torch.manual_seed(args.seed)
        train = bare_runner(Transformer(config), cfg, pad_id, precision, device)
        return lambda r: (time_bare(train, batches, args.warmup, device), timed_tokens)

    def real(precision: str) -> Callable[[int], tuple[float, int]]:
        def go(r: int) -> tuple[float, int]:
            seconds, n, _ = time_real(args, precision, work / "run")
            if n != timed_tokens:  # the comparison is only fair on the same batches
                raise RuntimeError(f"real loop saw {n} target tokens, the bare {timed_tokens}")
            return seconds, n

        return go

    for precision in precisions:
        contenders[f"bare {precision}"] = bare(precision)
        if not args.bare_only:
            contenders[f"real {precision}"] = real(precision)
    if "32-true" in precisions and not args.no_torch and not args.bare_only:
        torch.manual_seed(args.seed)
        torch_train = bare_runner(TorchTransformerMT(config), cfg, pad_id, "32-true", device)
        contenders["nn.Transformer 32-true"] = lambda r: (
            time_bare(torch_train, batches, args.warmup, device),
            timed_tokens,
        )

    names = list(contenders)
    rates: dict[str, list[float]] = {n: [] for n in names}
    for r in range(args.repeats):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            seconds, n = contenders[name](r)
            rates[name].append(n / seconds)
            log.info("repeat %d %-24s %8.0f tok/s", r + 1, name, n / seconds)

    rows = []
    for name in names:
        kind, precision = name.rsplit(" ", 1)
        row: dict[str, Any] = {
            "contender": kind,
            "precision": precision,
            "tokens_per_s": statistics.median(rates[name]),
            "tokens_per_s_all": rates[name],
        }
        bare_name = f"bare {precision}"
        if name != bare_name and bare_name in rates:
            ratios = [a / b for a, b in zip(rates[name], rates[bare_name])]
            row["vs_bare_same_precision"] = statistics.median(ratios)
        if "bare 32-true" in rates and name != "bare 32-true":
            ratios = [a / b for a, b in zip(rates[name], rates["bare 32-true"])]
            row["vs_bare_fp32"] = statistics.median(ratios)
        rows.append(row)
    return {
        "benchmark": "loop",
        "settings": {
            "data": args.data,
            "model": config.to_dict(),
            "steps": args.steps,
            "warmup_steps": args.warmup,
            "repeats": args.repeats,
            "target_tokens_per_batch": tokens,
            "max_tokens": int(cfg.data.max_tokens),
            "log_every_n_steps": int(cfg.trainer.log_every_n_steps),
            "device": str(device),
            "quick": args.quick,
            "skipped_precisions": skipped,
        },
        "rows": rows,
        "environment": environment(),
    }


def table(result: dict[str, Any]) -> str:
    env = result["environment"]
    lines = [
        f"CPU: {env['cpu']} ({env['cpu_capability']}); GPU: {env['cuda'] or 'none'}",
        f"threads: intra-op {env['intra_op_threads']}, inter-op {env['inter_op_threads']}, "
        f"OMP_WAIT_POLICY={env['OMP_WAIT_POLICY']}, OMP_NUM_THREADS={env['OMP_NUM_THREADS']}; "
        f"load average {' '.join(f'{x:.2f}' for x in env['load_average'])}",
        f"{result['settings']['steps']} steps ({result['settings']['warmup_steps']} warmup) x "
        f"{result['settings']['repeats']} repeats, data {result['settings']['data']}",
        "",
        f"| {'contender':<15} | {'precision':<10} | {'tok/s (median)':>14} | "
        f"{'vs bare (same)':>14} | {'vs bare fp32':>12} |",
        f"|{'-' * 17}|{'-' * 12}|{'-' * 16}|{'-' * 16}|{'-' * 14}|",
    ]
    for row in result["rows"]:
        same = row.get("vs_bare_same_precision")
        fp32 = row.get("vs_bare_fp32")
        lines.append(
            f"| {row['contender']:<15} | {row['precision']:<10} | {row['tokens_per_s']:>14,.0f} | "
            f"{f'{same:.2f}x' if same else '':>14} | {f'{fp32:.2f}x' if fp32 else '':>12} |"
        )
    for precision, why in result["settings"]["skipped_precisions"].items():
        lines.append(f"skipped {precision}: {why}")
    return "\n".join(lines)


#: Thread settings compared by --thread-study: (intra-op threads, OMP_WAIT_POLICY).
THREAD_SETTINGS = [(2, "ACTIVE"), (2, "PASSIVE"), (1, "PASSIVE")]


def thread_study(args: argparse.Namespace) -> dict[str, Any]:
    """Bare-step tokens/s per thread setting, each in its own process (OpenMP reads
    ``OMP_WAIT_POLICY`` once, at start-up); the settings alternate over ``--repeats`` rounds.
    """
    import subprocess

    rates: dict[str, list[float]] = {f"{t} threads, {p}": [] for t, p in THREAD_SETTINGS}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            order = THREAD_SETTINGS[r % 3 :] + THREAD_SETTINGS[: r % 3]
            for threads, policy in order:
                out = Path(tmp) / f"{threads}-{policy}-{r}.json"
                command = [
                    sys.executable,
                    __file__,
                    "--bare-only",
                    "--no-torch",
                    "--repeats",
                    "1",
                    "--precisions",
                    "32-true",
                    "--threads",
                    str(threads),
                    "--steps",
                    str(args.steps),
                    "--warmup",
                    str(args.warmup),
                    "--data",
                    args.data,
                    "--data-dir",
                    str(args.data_dir),
                    "--out",
                    str(out),
                ] + (["--quick"] if args.quick else [])
                env = {**os.environ, "OMP_WAIT_POLICY": policy}
                subprocess.run(command, env=env, check=True, capture_output=True)
                rate = json.loads(out.read_text())["rows"][0]["tokens_per_s"]
                rates[f"{threads} threads, {policy}"].append(rate)
                log.info("round %d %d threads %-7s %8.0f tok/s", r + 1, threads, policy, rate)
    return {
        "benchmark": "loop-threads",
        "settings": {"steps": args.steps, "warmup_steps": args.warmup, "rounds": args.repeats},
        "rows": [
            {"setting": k, "bare_tokens_per_s": statistics.median(v), "all": v}
            for k, v in rates.items()
        ],
        "environment": environment(),
    }


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=2, help="torch intra-op threads (default 2)")
    p.add_argument("--steps", type=int, default=24, help="training steps per timed run")
    p.add_argument("--warmup", type=int, default=4, help="untimed steps at the start of each run")
    p.add_argument("--repeats", type=int, default=3, help="interleaved repeats (median)")
    p.add_argument("--precisions", nargs="+", default=["32-true", "bf16-mixed"], choices=PRECISIONS)
    p.add_argument("--no-torch", action="store_true", help="skip the nn.Transformer row")
    p.add_argument("--bare-only", action="store_true", help="only the bare-step rows")
    p.add_argument(
        "--thread-study",
        action="store_true",
        help="bare step per (threads, OMP_WAIT_POLICY) setting, one process each",
    )
    p.add_argument(
        "--data",
        choices=["auto", "multi30k", "generated"],
        default="auto",
        help="auto: Multi30k files when present, else the generated corpus",
    )
    p.add_argument("--data-dir", type=Path, default=MULTI30K)
    p.add_argument("--accelerator", default="cpu", help="cpu (default), gpu or auto")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--quick", action="store_true", help="tiny model and data: seconds")
    p.add_argument("--override", nargs="*", default=[], help="extra Hydra overrides for the config")
    p.add_argument(
        "--out", type=Path, default=None, help="JSON path (default docs/benchmarks/loop.json)"
    )
    return p


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = build_parser().parse_args(argv)
    if args.warmup >= args.steps:
        raise SystemExit(f"error: --warmup ({args.warmup}) must be below --steps ({args.steps})")
    if args.data == "auto":
        args.data = "multi30k" if (args.data_dir / "train.de.gz").is_file() else "generated"
    if args.thread_study:
        result = thread_study(args)
        out = args.out or ROOT / "docs" / "benchmarks" / "loop_threads.json"
        text = "\n".join(
            f"{row['setting']:<22} {row['bare_tokens_per_s']:>8,.0f} tok/s (bare step, median)"
            for row in result["rows"]
        )
        text += (
            f"\nCPU: {result['environment']['cpu']}; load {result['environment']['load_average']}"
        )
    else:
        result = run(args)
        out = args.out or ROOT / "docs" / "benchmarks" / "loop.json"
        text = table(result)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(text)
    print(f"\nwritten: {out}")
    return result


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    main()
