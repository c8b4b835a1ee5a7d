"""The public Python API (``transformer_mt`` exports it): a thin face over the commands' own
parts, the translator and engines of ``transformer-mt-translate``, the forced decoding of
``transformer-mt-score``, and the Hydra configs and pipelines of ``train.py``/``evaluate.py``.
Settings keep their library names (``beam_size=4``), overrides their Hydra ones."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from transformer_mt.cli.hydra_app import CONFIG_DIR, register_configs
from transformer_mt.cli.options import load_translator
from transformer_mt.inference import translator as core
from transformer_mt.inference.score import PairScore, score_pairs
from transformer_mt.inference.search import SearchConfig
from transformer_mt.inference.translator import Translation

#: What a call may set by keyword: every field of :class:`SearchConfig`.
SEARCH_SETTINGS = tuple(f.name for f in dataclasses.fields(SearchConfig))


class Translator:
    """Translate and score with a checkpoint (or an ensemble), one result per line, in order.

    Make one with :meth:`from_checkpoint`. A call searches as the checkpoint stores it, with
    any :class:`SearchConfig` field given by keyword on top (``beam_size=5, nbest=3``,
    ``sampling_topk=10, seed=1``), or a whole ``search=SearchConfig(...)``.
    """

    def __init__(self, translator: core.Translator) -> None:
        self._default = translator

    @classmethod
    def from_checkpoint(
        cls,
        path: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        *,
        engine: str = "torch",
        ct2_model: str | os.PathLike[str] | None = None,
        compute_type: str | None = None,
        device: str = "auto",
        tgt_lang: str | None = None,
        max_tokens: int | None = None,
        max_sentences: int | None = None,
    ) -> Translator:
        """Load ``path`` (a ``.ckpt``; several: an ensemble) and open its ``engine``: ``torch``
        or ``ctranslate2`` (converted on the fly unless ``ct2_model`` names an export), with
        ``compute_type`` (``int8``, ...) and the torch model on ``device``. ``tgt_lang``: the
        target of a multilingual checkpoint; ``max_tokens``/``max_sentences``: the batch size
        (default: the checkpoint's ``data.eval_max_tokens``)."""
        paths = [path] if isinstance(path, (str, os.PathLike)) else list(path)
        translator = load_translator(
            paths, engine=engine, ct2_model=ct2_model, compute_type=compute_type, device=device,
            tgt_lang=tgt_lang, max_tokens=max_tokens, max_sentences=max_sentences,
        )  # fmt: skip
        return cls(translator)

    def translate(self, lines: Sequence[str], **options: Any) -> list[str]:
        """The best translation of each line (empty lines stay empty); options as
        :meth:`translate_batch` takes them."""
        return [t.text for t in self.translate_batch(lines, **options)]

    def translate_batch(
        self,
        lines: Sequence[str],
        search: SearchConfig | None = None,
        *,
        prefixes: Sequence[str] | None = None,
        constraints: Sequence[Sequence[str]] | None = None,
        alignments: bool = False,
        tgt_lang: str | None = None,
        **settings: Any,
    ) -> list[Translation]:
        """Each line's n-best list with scores, subwords and (``alignments``) word alignments.

        ``prefixes``: one per line (``""``: none) that its output starts with;
        ``constraints``: phrases per line (``[]``: none) that its output contains (beam
        search, torch engine); ``tgt_lang``: the target of a multilingual checkpoint.
        """
        if isinstance(lines, str):
            raise TypeError(f"lines is one string ({lines[:20]!r}); pass a list: [{lines[:20]!r}]")
        unknown = sorted(set(settings) - set(SEARCH_SETTINGS))
        if unknown:
            raise TypeError(
                f"unknown search setting {', '.join(unknown)}; the settings are "
                f"{', '.join(SEARCH_SETTINGS)}"
            )
        translator = self._default.into(tgt_lang)
        search = SearchConfig.from_stored(
            dataclasses.asdict(search or translator.search), **settings
        )
        return translator.translate_batch(
            lines, search, prefixes=prefixes, constraints=constraints, alignments=alignments
        )

    def score(
        self, sources: Sequence[str], targets: Sequence[str], *, truncate: bool = False,
        tgt_lang: str | None = None,
    ) -> list[PairScore]:  # fmt: skip
        """Each target's log-probability given its source (per token, ``<eos>`` last; ``.total``,
        ``.mean``); a side longer than the model takes is refused, or cut (``truncate``)."""
        return score_pairs(self._default.into(tgt_lang), sources, targets, truncate=truncate)


@dataclasses.dataclass(frozen=True)
class TrainResult:
    """A training run's directory (``checkpoints/``, ``csv/``, ...), its ``optimized_metric``
    (``val/bleu`` by default; ``None`` without a validation: what the command gives a sweep),
    and the metrics of the command's summary (``val/bleu``, ``test/bleu``, ``test/chrf``, ...)."""

    run_dir: Path
    metric: float | None
    metrics: dict[str, float]


def train(*, overrides: Sequence[str] = ()) -> TrainResult:
    """Train as ``python train.py OVERRIDES`` does (``["experiment=multi30k_de_en"]``), into
    ``run_dir=`` or the command's own ``outputs/<task>/runs/<time>``. The command's process
    settings (OpenMP, the heap) are the caller's."""
    from transformer_mt.cli.train import train as run  # Lightning, when asked for

    cfg, metrics = _compose("train", overrides), dict[str, float]()
    metric = run(cfg, metrics)
    return TrainResult(Path(cfg.run_dir), metric, metrics)


def evaluate(*, overrides: Sequence[str] = ()) -> dict[str, Any]:
    """Evaluate as ``python evaluate.py OVERRIDES`` does (``["ckpt_path=PATH"]``); its results
    (``results.json``: the metrics, settings and speed)."""
    from transformer_mt.cli.evaluate import evaluate as run

    return run(_compose("evaluate", overrides))


def _compose(name: str, overrides: Sequence[str]) -> Any:
    """``configs/<name>.yaml`` with ``overrides``, as the command composes it; ``run_dir``
    defaults to the directory Hydra would run the command in."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    register_configs()
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        where = compose(name, list(overrides), return_hydra_config=True).hydra.run.dir
        cfg = compose(name, list(overrides))
    if OmegaConf.is_interpolation(cfg, "run_dir"):  # ${hydra:runtime.output_dir}
        cfg.run_dir = str(Path(where).resolve())
    return cfg
