"""Sequence-level knowledge distillation (Kim & Rush, 2016): a teacher's translations of the
training sources, kept so that every student of that teacher reuses them.

They live in ``<root>/<key>/``, the key a hash of the teacher's checkpoint files, its decoding
settings and the source sentences: another teacher, other settings or other data get their
own folder, and a folder whose ``teacher.json`` names another teacher is never written into.
``shard-NNNNN.txt`` holds the translations of each ``shard_size`` sources, written whole, so an
interrupted decode resumes at the first missing shard; ``targets.txt`` joins them at the end.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from transformer_mt.files import write_text_atomic
from transformer_mt.inference.translator import Translator

log = logging.getLogger(__name__)

TEACHER_FILE = "teacher.json"
TARGETS_FILE = "targets.txt"


def file_digest(path: str | Path) -> str:
    """The SHA-256 of a file's bytes (a checkpoint's identity, wherever it is kept)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()


def _key(identity: Mapping[str, Any]) -> str:
    """What decides the translations: the checkpoints' bytes (not where they are kept), the
    settings and the sources; not how long the decode took."""
    keyed = {k: v for k, v in identity.items() if k not in ("checkpoints", "decode")}
    keyed["digests"] = [c["sha256"] for c in identity.get("checkpoints", [])]
    return _digest(keyed)[:16]


def distil(
    sources: Sequence[str],
    teacher: Mapping[str, Any],
    open_teacher: Callable[[], Translator],
    root: str | Path,
    *,
    shard_size: int = 2000,
) -> tuple[Path, dict[str, Any]]:
    """The teacher's translation of every source, one line each: the file and what made it.

    Args:
        sources: the training sources, in order.
        teacher: what identifies the teacher (checkpoint digests, decoding settings, engine);
            JSON-plain. Paths may be in it under ``checkpoints``: they do not change the key.
        open_teacher: loads the teacher; called only when a shard is missing.
        root: the folder of all teachers' translations.

    Raises:
        ValueError: the folder for this key holds files another teacher made (or none made).
    """
    if shard_size < 1:
        raise ValueError(f"distill.shard_size must be >= 1, got {shard_size}")
    identity = {**teacher, "shard_size": shard_size}
    identity["sources"] = {"count": len(sources), "sha256": _digest(list(sources))}
    folder = _own_folder(Path(root), identity)
    record, target = folder / TEACHER_FILE, folder / TARGETS_FILE
    if target.is_file():
        log.info("Training on the teacher's translations kept in %s", folder)
        return target, json.loads(record.read_text(encoding="utf-8"))
    shards = [folder / f"shard-{i:05d}.txt" for i in range(math.ceil(len(sources) / shard_size))]
    missing = [i for i, path in enumerate(shards) if not path.is_file()]
    if len(missing) < len(shards):
        log.info("Resuming the teacher's decode: %d of %d shards done",
                 len(shards) - len(missing), len(shards))  # fmt: skip
    started = time.monotonic()
    done = _decode(sources, open_teacher(), shards, missing, shard_size) if missing else 0
    text = "".join(path.read_text(encoding="utf-8") for path in shards)
    if text.count("\n") != len(sources):  # a guard: one line per source, or no training
        raise ValueError(f"{folder}: the shards hold {text.count(chr(10))} lines for "
                         f"{len(sources)} sources; remove the folder and decode again")  # fmt: skip
    write_text_atomic(target, text)
    for path in shards:
        path.unlink()
    stored = json.loads(record.read_text(encoding="utf-8"))
    stored["decode"] = {
        "seconds": round(time.monotonic() - started, 1),
        "sentences": done,
        "resumed": len(missing) < len(shards),
    }
    write_text_atomic(record, json.dumps(stored, indent=2, ensure_ascii=False) + "\n")
    return target, stored


def _own_folder(root: Path, identity: Mapping[str, Any]) -> Path:
    """The folder of this teacher's translations, made with its ``teacher.json``.

    Raises:
        ValueError: the folder exists and its record names another teacher, or none.
    """
    folder = root / _key(identity)
    record = folder / TEACHER_FILE
    if not folder.exists():
        write_text_atomic(record, json.dumps(identity, indent=2, ensure_ascii=False) + "\n")
        return folder
    try:
        ours = _key(json.loads(record.read_text(encoding="utf-8"))) == folder.name
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        ours = False
    if not ours:
        raise ValueError(
            f"{folder} holds files this teacher did not make; choose another distill.dir"
        )
    return folder


def _decode(
    sources: Sequence[str], translator: Translator, shards: list[Path], missing: list[int],
    size: int,
) -> int:  # fmt: skip
    """Translate the ``missing`` shards, each written whole, logging the rate and time left;
    the number of sentences translated."""
    log.info("Teacher: translating %d shards of %d sources into %s", len(missing), size,
             shards[0].parent)  # fmt: skip
    started, done = time.monotonic(), 0
    for number, i in enumerate(missing, 1):
        lines = sources[i * size : (i + 1) * size]
        out = translator.translate(lines)
        write_text_atomic(shards[i], "".join(f"{line}\n" for line in out))
        done += len(lines)
        rate = done / max(time.monotonic() - started, 1e-9)
        left = sum(len(sources[j * size : (j + 1) * size]) for j in missing[number:])
        log.info(
            "Teacher: shard %d of %d decoded, %.1f sentences/s, about %.0f min left",
            i + 1, len(shards), rate, left / rate / 60,
        )  # fmt: skip
    return done
