"""The evaluation pipeline behind evaluate.py: checkpoint -> data -> decode -> sacreBLEU.

``python evaluate.py ckpt_path=PATH`` scores a checkpoint on the test split of the data it was
trained on, with the tokenizer and model config stored in the checkpoint; overrides pick
another split, other files or other decoding options (see ``configs/evaluate.yaml``); which
data config a split comes from is :mod:`transformer_mt.inference.eval_data`'s job.

No Lightning: the split is built by :func:`transformer_mt.data.prepare.prepare` and batched by
:func:`~transformer_mt.data.prepare.decode_loader`, the loader of validation and test in
training, and decoded by the same loop (:mod:`transformer_mt.inference.decode`), so the BLEU
printed here is the trainer's ``test/bleu`` for the same checkpoint and decoding options.

Results go to ``results.json`` and the hypotheses to a text file in the run directory, and a
short table is printed.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from transformer_mt.checkpoint import CheckpointError, LoadedModel, load_model, resolve_device
from transformer_mt.data.collate import source_limit
from transformer_mt.data.prepare import decode_loader
from transformer_mt.files import (
    check_output_file,
    check_outputs_apart,
    read_text_lines,
    write_text_atomic,
)
from transformer_mt.inference.alignment import pharaoh
from transformer_mt.inference.decode import Engine, decode, progress_bar
from transformer_mt.inference.engine import Converter, open_engine
from transformer_mt.inference.eval_data import (
    DataMismatchError,
    check_languages,
    load_split,
    resolve_data_config,
)
from transformer_mt.inference.metrics import corpus_scores, oracle_choice
from transformer_mt.inference.search import Hypothesis, SearchConfig
from transformer_mt.inference.settings import NO_CHECKPOINT, EvalSchema, data_overrides
from transformer_mt.inference.steer_files import read_steering
from transformer_mt.inference.translator import Translator, decoding_from

log = logging.getLogger(__name__)


def output_paths(cfg: EvalSchema) -> tuple[Path, Path]:
    """``results.json`` and the hypotheses file this evaluation writes."""
    results_path = Path(cfg.results_path or Path(cfg.run_dir) / "results.json")
    hyp_path = Path(cfg.hypotheses_path or results_path.with_name("hypotheses.txt"))
    return results_path, hyp_path


def alignments_path(cfg: EvalSchema) -> Path:
    """Where ``alignments=true`` writes the 1-best's word alignments: beside the hypotheses."""
    return output_paths(cfg)[1].with_name("alignments.txt")


def check_paths(cfg: EvalSchema) -> None:
    """Before any work: no output may overwrite or sit inside an input (files.py's rule)."""
    results_path, hyp_path = output_paths(cfg)
    inputs = [
        *(("ckpt_path", path) for path in checkpoint_paths(cfg)),
        ("source_file", cfg.source_file),
        ("reference_file", cfg.reference_file),
        ("engine_model", cfg.engine_model),
        ("prefix_file", cfg.prefix_file),
        ("constraints_file", cfg.constraints_file),
    ]
    data_dir = cfg.data.dir
    if data_dir:
        inputs.append(("data.dir", data_dir))
    outputs = [("results_path", results_path), ("hypotheses_path", hyp_path)]
    if cfg.alignments:
        outputs.append(("alignments", alignments_path(cfg)))
    check_outputs_apart(outputs, [(what, str(p)) for what, p in inputs if p])
    for what, path in outputs:
        check_output_file(path, what)


# ----------------------------------------------------------------------------- pipeline


@dataclass
class EvalInputs:
    """What to decode: the source lines, their references (if any) and the batches."""

    sources: list[str]
    references: list[str] | None
    batches: Iterable[dict[str, Any]]
    max_tokens: int | None
    max_sentences: int | None
    info: dict[str, Any]
    #: each line's direction (``"en-de"``) when a multilingual split is evaluated
    directions: list[str] | None = None


def checkpoint_paths(cfg: EvalSchema) -> list[Path]:
    """``ckpt_path``: one path, or a list of paths decoded as an ensemble."""
    if not cfg.ckpt_path:
        raise CheckpointError(NO_CHECKPOINT)
    value = cfg.ckpt_path
    paths = list(value) if isinstance(value, list | tuple) else [value]
    return [Path(str(p)) for p in paths]


def _file_inputs(cfg: EvalSchema, loaded: list[LoadedModel], engine: Engine) -> EvalInputs:
    source_file, reference_file = str(cfg.source_file), cfg.reference_file
    errors = cfg.errors
    sources = read_text_lines(source_file, "source_file", errors=errors, fix="errors=replace")
    references = (
        read_text_lines(str(reference_file), "reference_file", errors=errors, fix="errors=replace")
        if reference_file
        else None
    )
    if references is not None and len(references) != len(sources):
        raise DataMismatchError(
            f"source_file has {len(sources)} lines but reference_file has "
            f"{len(references)}; they must be line-aligned"
        )
    translator = Translator(
        loaded,
        max_tokens=cfg.batch.max_tokens,
        max_sentences=cfg.batch.sentences,
        engine=engine,
        tgt_lang=cfg.tgt_lang,
    )
    batches = translator.batches(translator.encode(sources, where=source_file))
    info = {
        "source_file": source_file,
        "reference_file": str(reference_file) if reference_file else None,
    }
    return EvalInputs(
        sources, references, batches, translator.max_tokens, translator.max_sentences, info
    )


def _split_inputs(cfg: EvalSchema, loaded: list[LoadedModel]) -> EvalInputs:
    data, origin = resolve_data_config(data_overrides(cfg.data), loaded[0])
    check_languages(data, loaded[0])
    split = cfg.split
    prepared = load_split(data, loaded[0], split)
    max_tokens, max_sentences = cfg.batch.max_tokens, cfg.batch.sentences
    if max_tokens is None and max_sentences is None:
        max_tokens = data.eval_max_tokens
    limit = source_limit(data.max_len, min(m.config.max_len for m in loaded))
    batches = decode_loader(
        prepared, split, limit, max_tokens=max_tokens, max_sentences=max_sentences
    )
    rows = prepared.splits[split]
    return EvalInputs(
        list(rows["src"]),
        list(rows["tgt"]),
        batches,
        max_tokens,
        max_sentences,
        {"split": split, "origin": origin, "config": data.to_dict()},
        list(rows["direction"]) if "direction" in rows.column_names else None,
    )


def _search(cfg: EvalSchema, loaded: LoadedModel) -> SearchConfig:
    # The best setting of a decoding sweep fills what the checkpoint stores; decoding.* wins.
    stored = {**(loaded.decoding or {}), **decoding_from(cfg.decoding_from)}
    return SearchConfig.from_stored(stored, **asdict(cfg.decoding))


def _timed_decode(
    engine: Engine, inputs: EvalInputs, search: SearchConfig, *, device: str, progress: bool
) -> tuple[list[list[Hypothesis]], float]:
    """The n-best lists in input order and the wall time of decoding them."""
    log.info("decoding %d sentences on %s: %s", len(inputs.sources), device, _search_name(search))
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    start = time.perf_counter()
    with progress_bar(progress, len(inputs.sources)) as advance:
        nbest_lists = decode(engine, inputs.batches, search, advance)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return nbest_lists, time.perf_counter() - start


def run(cfg: EvalSchema, *, convert: Converter | None = None) -> dict[str, Any]:
    """Evaluate ``cfg.ckpt_path``; write results.json and the hypotheses; return the results.

    ``convert``: how a CTranslate2 engine without ``engine_model`` gets its model directory
    (:func:`~transformer_mt.inference.engine.open_engine`).
    """
    paths = checkpoint_paths(cfg)
    check_paths(cfg)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    device = resolve_device(cfg.device)
    loaded = [load_model(path, device) for path in paths]
    search = _search(cfg, loaded[0])
    engine = open_engine(
        cfg.engine,
        loaded,
        ct2_model=cfg.engine_model,
        compute_type=cfg.compute_type,
        threads=cfg.threads,
        convert=convert,
    )
    inputs = _file_inputs(cfg, loaded, engine) if cfg.source_file else _split_inputs(cfg, loaded)
    if not inputs.sources:  # a score of nothing would read as a result
        where = cfg.source_file or f"split {cfg.split!r}"
        raise DataMismatchError(
            f"nothing to evaluate: {where} has no lines; pass a file or split with sentences"
        )
    if inputs.directions is not None and (
        cfg.prefix_file or cfg.constraints_file or cfg.alignments
    ):
        raise DataMismatchError(
            "prefixes, constraints and alignments of a multilingual split are not supported; "
            "evaluate one direction's files with source_file=... tgt_lang=..."
        )
    translator = Translator(
        loaded,
        max_tokens=inputs.max_tokens,
        max_sentences=inputs.max_sentences,
        engine=engine,
        # A multilingual split carries its own tags; the translator's language is unused.
        tgt_lang=cfg.tgt_lang or (loaded[0].tokenizer.target_languages or [None])[0],
    )
    _steer(cfg, translator, inputs)
    nbest_lists, elapsed = _timed_decode(
        engine, inputs, search, device=device, progress=cfg.progress
    )
    texts = _texts(loaded[0].tokenizer, nbest_lists)
    results = _results(cfg, loaded, inputs, search, device=device, elapsed=elapsed)
    if inputs.references is not None:
        if inputs.directions is not None:
            results.update(_direction_metrics(texts, inputs.references, inputs.directions))
        else:
            lang = translator.tgt_lang or loaded[0].tgt_lang or "en"
            results.update(_metrics(texts, inputs.references, lang=lang))
    if cfg.alignments:
        _write_alignments(cfg, results, translator, inputs.sources, nbest_lists)
    _write_outputs(cfg, results, texts, nbest_lists)
    _print_table(results)
    return results


def _steer(cfg: EvalSchema, translator: Translator, inputs: EvalInputs) -> None:
    """With ``prefix_file``/``constraints_file``, batch the sources with their steering (the
    translator's batches follow the rule of the split's loader)."""
    if not (cfg.prefix_file or cfg.constraints_file):
        return
    n = len(inputs.sources)
    prefixes, constraints = read_steering(
        cfg.prefix_file, cfg.constraints_file, n, errors=cfg.errors,
        flags=("prefix_file", "constraints_file"),
    )  # fmt: skip
    steer = translator.steering(n, prefixes, constraints)
    inputs.batches = translator.batches(translator.encode(inputs.sources), steer=steer)
    inputs.info.update(prefix_file=cfg.prefix_file, constraints_file=cfg.constraints_file)


def _write_alignments(
    cfg: EvalSchema,
    results: dict[str, Any],
    translator: Translator,
    sources: list[str],
    nbest_lists: list[list[Hypothesis]],
) -> None:
    """alignments.txt: the 1-best's Pharaoh pairs, a line per sentence."""
    links = translator.align(translator.encode(sources), [h[0].tokens for h in nbest_lists])
    path = alignments_path(cfg)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, "".join(pharaoh(pairs) + "\n" for pairs in links))
    results["alignments_path"] = str(path)


def _texts(tokenizer: Any, nbest_lists: list[list[Hypothesis]]) -> list[list[str]]:
    """The n-best lists as text (one decode call for all of them)."""
    flat = iter(tokenizer.decode_hypotheses([h.tokens for hyps in nbest_lists for h in hyps]))
    return [[next(flat) for _ in hyps] for hyps in nbest_lists]


def _results(
    cfg: EvalSchema,
    loaded: list[LoadedModel],
    inputs: EvalInputs,
    search: SearchConfig,
    *,
    device: str,
    elapsed: float,
) -> dict[str, Any]:
    first, n = loaded[0], len(inputs.sources)
    checkpoint = {
        "path": str(first.path),
        "global_step": first.global_step,
        "epoch": first.epoch,
        "src_lang": first.src_lang,
        "tgt_lang": first.tgt_lang,
        "parameters": first.model.num_parameters(),
    }
    if len(loaded) > 1:
        checkpoint["ensemble"] = [str(m.path) for m in loaded]
    decoding = {
        **asdict(search),
        "max_tokens": inputs.max_tokens,
        "batch_sentences": inputs.max_sentences,
        "device": device,
        "engine": cfg.engine,
        "compute_type": cfg.compute_type,
    }
    return {
        "checkpoint": checkpoint,
        "data": inputs.info,
        "decoding": decoding,
        "n_sentences": n,
        "decoding_time_s": round(elapsed, 4),
        "sentences_per_s": round(n / elapsed, 2) if elapsed > 0 else None,
    }


def _metrics(texts: list[list[str]], references: list[str], *, lang: str) -> dict[str, Any]:
    """BLEU, lowercased BLEU, tokenized BLEU and chrF of the 1-best; the n-best's oracle BLEU."""
    scores = corpus_scores([hyps[0] for hyps in texts], references, lang=lang)
    metrics = {
        "bleu": scores.bleu,
        "bleu_lc": scores.bleu_lc,
        "bleu_tok": scores.bleu_tok,
        "chrf": scores.chrf,
    }
    if any(len(hyps) > 1 for hyps in texts):
        oracle = corpus_scores(oracle_choice(texts, references), references, lang=lang)
        metrics["oracle_bleu"] = oracle.bleu
    signature = {
        "bleu": scores.bleu_signature,
        "chrf": scores.chrf_signature,
        "bleu_tok": scores.bleu_tok_signature,
    }
    return {"metrics": metrics, "signature": signature}


def _direction_metrics(
    texts: list[list[str]], references: list[str], directions: list[str]
) -> dict[str, Any]:
    """Each direction's metrics under ``directions``, and their means as ``metrics``."""
    per: dict[str, Any] = {}
    for d in sorted(set(directions)):
        rows = [i for i, x in enumerate(directions) if x == d]
        per[d] = _metrics(
            [texts[i] for i in rows], [references[i] for i in rows], lang=d.split("-", 1)[1]
        )
        per[d]["n_sentences"] = len(rows)
    names = ("bleu", "bleu_lc", "bleu_tok", "chrf")
    mean = {n: sum(p["metrics"][n] for p in per.values()) / len(per) for n in names}
    first = next(iter(per.values()))
    return {"metrics": mean, "signature": first["signature"], "directions": per}


def _write_outputs(
    cfg: EvalSchema,
    results: dict[str, Any],
    texts: list[list[str]],
    nbest_lists: list[list[Hypothesis]],
) -> None:
    """hypotheses.txt (1-best), nbest.txt (with decoding.nbest > 1), then results.json."""
    results_path, hyp_path = output_paths(cfg)
    results["hypotheses_path"] = str(hyp_path)
    for path in (results_path, hyp_path):
        path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(hyp_path, "".join(hyps[0] + "\n" for hyps in texts))
    if results["decoding"]["nbest"] > 1:
        nbest_path = hyp_path.with_name("nbest.txt")
        lines = (
            f"{i}\t{rank}\t{h.score:.4f}\t{text}\n"
            for i, (hyps, strings) in enumerate(zip(nbest_lists, texts))
            for rank, (h, text) in enumerate(zip(hyps, strings), start=1)
        )
        write_text_atomic(nbest_path, "".join(lines))
        results["nbest_path"] = str(nbest_path)
    write_text_atomic(results_path, json.dumps(results, indent=2, ensure_ascii=False) + "\n")
    results["results_path"] = str(results_path)


def _search_name(search: Any) -> str:
    if search.sampling:
        return (
            f"sampling (top-k {search.sampling_topk or 'all'}, top-p {search.sampling_topp or 1}, "
            f"temperature {search.temperature}, seed {search.seed})"
        )
    return "greedy" if search.beam_size == 1 else f"beam {search.beam_size}"


def _print_table(results: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="transformer-mt: evaluation", show_header=False)
    data = results["data"]
    table.add_row("checkpoint", results["checkpoint"]["path"])
    table.add_row("data", data.get("source_file") or f"{data['split']} ({data['origin']})")
    dec = results["decoding"]
    search = SearchConfig.from_stored(dec)
    table.add_row(
        "decoding",
        _search_name(search)
        if search.beam_size == 1
        else f"beam {dec['beam_size']}, alpha {dec['length_penalty']} "
        f"({dec.get('length_norm', 'gnmt')})",
    )
    mean = " (mean of the directions)" if results.get("directions") else ""
    for name, value in (results.get("metrics") or {}).items():
        table.add_row(name + mean, f"{value:.2f}")
    for direction, part in (results.get("directions") or {}).items():
        m = part["metrics"]
        table.add_row(
            direction,
            f"bleu {m['bleu']:.2f}, bleu_tok {m['bleu_tok']:.2f}, chrf {m['chrf']:.2f}",
        )
    if "signature" in results:
        table.add_row("signature", results["signature"]["bleu"])
    table.add_row("sentences", str(results["n_sentences"]))
    table.add_row(
        "time",
        f"{results['decoding_time_s']:.2f} s ({results['sentences_per_s'] or 0:.1f} sentences/s)",
    )
    table.add_row("results", results["results_path"])
    Console().print(table)
