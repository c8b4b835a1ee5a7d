"""Byte-level BPE (Hugging Face ``tokenizers``), joint or separate vocabularies.

Every string encodes (``<unk>`` never appears) and ``decode(encode(x)) == x``; the specials
have fixed ids ``<pad>=0, <bos>=1, <eos>=2, <unk>=3``. Each side's post-processor appends
``<eos>``; ``<bos>`` is the decoder's start token. ``save`` writes standard ``tokenizers``
files plus ``tokenizer_meta.json``; ``to_json`` is one string of both, for checkpoints.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, processors, trainers

from transformer_mt.files import write_text_atomic

log = logging.getLogger(__name__)

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIAL_TOKENS = (PAD, BOS, EOS, UNK)  # their index is their id
PAD_ID, BOS_ID, EOS_ID, UNK_ID = range(4)
#: Smallest useful vocabulary: the specials plus the 256 byte symbols.
MIN_VOCAB_SIZE = len(SPECIAL_TOKENS) + 256
#: Standard ``tokenizers`` file of the source side (the joint vocabulary when joint).
FILENAME = "tokenizer.json"
#: Standard ``tokenizers`` file of the target side, written only for separate vocabularies.
TARGET_FILENAME = "target_tokenizer.json"
#: Our metadata beside the standard files: languages, joint or not, training settings.
META_FILENAME = "tokenizer_meta.json"
FORMAT = "transformer_mt.tokenizer"
VERSION = 1

Side = Literal["src", "tgt"]


def train_bpe(
    texts: Iterable[list[str]] | Iterator[list[str]],
    vocab_size: int,
    min_frequency: int = 2,
) -> HFTokenizer:
    """Train a byte-level BPE tokenizer on batches (lists) of text, to ``vocab_size`` subwords
    (specials and bytes included) from merges seen at least ``min_frequency`` times.

    Raises:
        ValueError: ``vocab_size`` is smaller than specials + 256 bytes.
    """
    if vocab_size < MIN_VOCAB_SIZE:
        raise ValueError(
            f"vocab_size={vocab_size} is too small for byte-level BPE: it needs "
            f"{MIN_VOCAB_SIZE} (4 special tokens + 256 bytes) plus merges; "
            "use e.g. data.vocab_size=8000 (or 512 for the numbers task)."
        )
    tokenizer = HFTokenizer(models.BPE(unk_token=UNK))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    for token_id, token in enumerate(SPECIAL_TOKENS):
        assert tokenizer.token_to_id(token) == token_id, "special-token ids must be fixed"
    return add_eos_post_processor(tokenizer)


def add_eos_post_processor(tokenizer: HFTokenizer) -> HFTokenizer:
    """Make ``encode(text)`` (special tokens on) return ``ids + <eos>``, in place (a pair
    template too, for libraries that encode pairs)."""
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"$A {EOS}",
        pair=f"$A {EOS} $B:1 {EOS}:1",
        special_tokens=[(EOS, EOS_ID)],
    )
    return tokenizer


_LINE_BREAKS = str.maketrans(dict.fromkeys("\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029", " "))


class Tokenizer:
    """Source and target BPE tokenizers behind one interface.

    Encoding returns bare subword ids by default (collate truncates, then appends
    ``<eos>``); decoding stops at the first ``<eos>`` and drops special tokens.

    Args:
        src, tgt: The source and target sides (``tgt`` ``None`` or ``src``: joint).
        config: How it was trained (``vocab_size``, ``min_frequency``, ``joint``), checked
            before a run directory's tokenizer is reused.
    """

    pad_id: int = PAD_ID
    bos_id: int = BOS_ID
    eos_id: int = EOS_ID
    unk_id: int = UNK_ID

    def __init__(
        self,
        src: HFTokenizer,
        tgt: HFTokenizer | None = None,
        src_lang: str | None = None,
        tgt_lang: str | None = None,
        config: dict[str, Any] | None = None,
    ) -> None:
        self.src = src
        self.tgt = src if tgt is None else tgt
        self.src_lang = src_lang
        self.tgt_lang = tgt_lang
        self.config = dict(config or {})
        for side, tok in (("src", self.src), ("tgt", self.tgt)):
            for token_id, token in enumerate(SPECIAL_TOKENS):
                if tok.token_to_id(token) != token_id:
                    raise ValueError(
                        f"The {side} tokenizer maps {token} to {tok.token_to_id(token)}, "
                        f"expected {token_id}; train it with Tokenizer.train."
                    )
            if tok.post_processor is None:
                add_eos_post_processor(tok)
        if self.config.get("tags"):
            self._tags_only_by_id()

    @classmethod
    def train(
        cls,
        src_texts: Iterable[list[str]],
        tgt_texts: Iterable[list[str]],
        *,
        vocab_size: int = 8000,
        joint: bool = True,
        min_frequency: int = 2,
        src_lang: str | None = None,
        tgt_lang: str | None = None,
    ) -> Tokenizer:
        """Train on batches of source and target text (the training split only); with
        ``joint=True`` the two streams are chained into one."""
        config = {"vocab_size": vocab_size, "min_frequency": min_frequency, "joint": joint}
        if joint:
            src = train_bpe(_chain(src_texts, tgt_texts), vocab_size, min_frequency)
            tokenizer = cls(src, None, src_lang, tgt_lang, config)
        else:
            src = train_bpe(src_texts, vocab_size, min_frequency)
            tgt = train_bpe(tgt_texts, vocab_size, min_frequency)
            tokenizer = cls(src, tgt, src_lang, tgt_lang, config)
        log.info(
            "Trained %s byte-level BPE: src vocab %d, tgt vocab %d",
            "joint" if joint else "separate",
            tokenizer.src_vocab_size,
            tokenizer.tgt_vocab_size,
        )
        return tokenizer

    def add_target_tags(self, langs: Sequence[str]) -> None:
        """Add the target-language tags (``<2de>``, ...) as special tokens, with the ids after
        the trained vocabulary, recorded in ``config["tags"]``.

        Raises:
            ValueError: a tag is already a subword of the vocabulary.
        """
        from tokenizers import AddedToken

        from transformer_mt.data.directions import tag

        tags = [tag(lang) for lang in langs]
        for side in {id(self.src): self.src, id(self.tgt): self.tgt}.values():
            clash = [t for t in tags if side.token_to_id(t) is not None]
            if clash:
                raise ValueError(
                    f"the language tag(s) {clash} are already pieces of the BPE vocabulary "
                    "(the training text contains them literally); remove them from the "
                    "training text, or rename the language codes in data.directions"
                )
        self.src.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in tags])
        if not self.joint:
            self.tgt.add_special_tokens(
                [AddedToken(t, special=True, normalized=False) for t in tags]
            )
        self.config["tags"] = tags
        self._tags_only_by_id()

    def _tags_only_by_id(self) -> None:
        # A tag is put in front of the ids, never read from text: typed "<2fr>" is characters.
        for side in (self.src, self.tgt):
            side.encode_special_tokens = True

    def tag_id(self, lang: str) -> int | None:
        """The id of ``lang``'s target tag, or ``None`` when this tokenizer has none."""
        from transformer_mt.data.directions import tag

        if tag(lang) not in self.config.get("tags", []):
            return None
        return self.src.token_to_id(tag(lang))

    @property
    def target_languages(self) -> list[str]:
        """The languages this tokenizer has target tags for (empty: one direction)."""
        return [t[2:-1] for t in self.config.get("tags", [])]

    @property
    def joint(self) -> bool:
        """True when source and target share one vocabulary."""
        return self.src is self.tgt

    @property
    def src_vocab_size(self) -> int:
        return self.src.get_vocab_size()

    @property
    def tgt_vocab_size(self) -> int:
        return self.tgt.get_vocab_size()

    @property
    def vocab_size(self) -> int:
        """The vocabulary size; with separate vocabularies the larger one."""
        return max(self.src_vocab_size, self.tgt_vocab_size)

    def difference(self, other: Tokenizer) -> str | None:
        """How ``other`` encodes differently from this tokenizer (the same size can still map
        ids to other subwords), or ``None`` if it does not."""
        ours = (self.src_vocab_size, self.tgt_vocab_size)
        theirs = (other.src_vocab_size, other.tgt_vocab_size)
        if ours != theirs:
            return f"vocabulary {ours[0]}/{ours[1]} (src/tgt) vs {theirs[0]}/{theirs[1]}"
        if self.src.get_vocab() != other.src.get_vocab():
            return f"the same size ({ours[0]}/{ours[1]}) but different source subwords"
        if self.tgt.get_vocab() != other.tgt.get_vocab():
            return f"the same size ({ours[0]}/{ours[1]}) but different target subwords"
        return None

    def _side(self, side: Side) -> HFTokenizer:
        if side == "src":
            return self.src
        if side == "tgt":
            return self.tgt
        raise ValueError(f"side must be 'src' or 'tgt', got {side!r}")

    def encode_batch(
        self, texts: Sequence[str], side: Side = "src", add_special_tokens: bool = False
    ) -> list[list[int]]:
        """Subword ids of each text: bare, or ``ids + <eos>`` with ``add_special_tokens``."""
        encodings = self._side(side).encode_batch(
            list(texts), add_special_tokens=add_special_tokens
        )
        return [e.ids for e in encodings]

    def decode_batch(self, ids: Sequence[Sequence[int]], side: Side = "tgt") -> list[str]:
        """Text of each id sequence: cut at the first ``<eos>``, specials dropped."""
        cut = []
        for seq in ids:
            seq = [int(i) for i in seq]
            if self.eos_id in seq:
                seq = seq[: seq.index(self.eos_id)]
            cut.append(seq)
        return self._side(side).decode_batch(cut, skip_special_tokens=True)

    def encode_src_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return self.encode_batch(texts, "src")

    def encode_tgt_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return self.encode_batch(texts, "tgt")

    def decode_tgt_batch(self, ids: Sequence[Sequence[int]]) -> list[str]:
        return self.decode_batch(ids, "tgt")

    def decode_hypotheses(self, ids: Sequence[Sequence[int]]) -> list[str]:
        """Generated target ids -> one line of text each: line breaks folded (they would shift
        an output file's lines), byte-level BPE's leading blank stripped."""
        texts = self.decode_tgt_batch(ids) if ids else []
        return [t.translate(_LINE_BREAKS).strip() for t in texts]

    def metadata(self) -> dict[str, Any]:
        """Everything but the vocabularies: format, languages, joint or not, training settings."""
        return {
            "format": FORMAT,
            "version": VERSION,
            "src_lang": self.src_lang,
            "tgt_lang": self.tgt_lang,
            "joint": self.joint,
            "config": self.config,
            "special_tokens": list(SPECIAL_TOKENS),
        }

    def to_json(self) -> str:
        """One JSON string: metadata plus each side's ``tokenizers`` JSON (for checkpoints)."""
        payload = {
            **self.metadata(),
            "src": json.loads(self.src.to_str()),
            "tgt": None if self.joint else json.loads(self.tgt.to_str()),
        }
        return json.dumps(payload, ensure_ascii=False)

    @classmethod
    def from_json(cls, text: str) -> Tokenizer:
        """Inverse of :meth:`to_json`.

        Raises:
            ValueError: the string is not a tokenizer written by ``to_json``.
        """
        payload = _parse(text, "Tokenizer JSON")
        if payload.get("format") != FORMAT:
            raise ValueError(
                f"Not a transformer_mt tokenizer (expected format {FORMAT!r}); "
                "write it with Tokenizer.save or Tokenizer.to_json."
            )
        _check_version(payload)
        src = HFTokenizer.from_str(json.dumps(payload["src"]))
        tgt = None if payload["tgt"] is None else HFTokenizer.from_str(json.dumps(payload["tgt"]))
        return cls(
            src, tgt, payload.get("src_lang"), payload.get("tgt_lang"), payload.get("config")
        )

    def save(self, directory: str | os.PathLike[str]) -> Path:
        """Write the standard files and then the metadata (which :meth:`load` checks the
        files against) into ``directory``, each atomically; return ``tokenizer.json``."""
        directory = Path(directory)
        path = directory / FILENAME
        write_text_atomic(path, self.src.to_str())  # a concurrent reader never sees half a file
        target = directory / TARGET_FILENAME
        if not self.joint:
            write_text_atomic(target, self.tgt.to_str())
        meta = {
            **self.metadata(),
            "files": {"src": FILENAME, "tgt": FILENAME if self.joint else TARGET_FILENAME},
            "vocab_sizes": {"src": self.src_vocab_size, "tgt": self.tgt_vocab_size},
        }
        write_text_atomic(directory / META_FILENAME, json.dumps(meta, indent=2) + "\n")
        return path

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Tokenizer:
        """Read a tokenizer from a directory or from its ``tokenizer.json``: what :meth:`save`
        writes, the older one-file format, or a bare ``tokenizer.json`` (joint, no languages).

        Raises:
            FileNotFoundError: no tokenizer there.
            ValueError: unreadable, or the files do not belong together.
        """
        path = Path(path)
        if path.is_dir():
            path = path / FILENAME
        if not path.is_file():
            raise FileNotFoundError(
                f"No tokenizer at {path}; train one (it is written to the run directory "
                "on the first run) or point at a directory holding tokenizer.json."
            )
        text = path.read_text(encoding="utf-8")
        payload = _parse(text, str(path))
        if payload.get("format") == FORMAT:  # the one-file format of earlier versions
            return cls.from_json(text)
        if "model" not in payload:
            raise ValueError(
                f"{path} is neither a tokenizers file nor a transformer_mt tokenizer; point at "
                "the tokenizer.json a training run wrote."
            )
        src = HFTokenizer.from_str(text)
        meta_path = path.parent / META_FILENAME
        if not meta_path.is_file():
            log.warning("%s has no %s beside it: assuming a joint vocabulary", path, META_FILENAME)
            return cls(src)
        meta = _parse(meta_path.read_text(encoding="utf-8"), str(meta_path))
        _check_version(meta)
        tgt = None
        if not meta.get("joint", True):
            target = path.parent / TARGET_FILENAME
            if not target.is_file():
                raise FileNotFoundError(
                    f"{meta_path} says the vocabularies are separate but {target} is missing; "
                    "copy the whole tokenizer directory (tokenizer*.json, target_tokenizer.json)."
                )
            tgt = HFTokenizer.from_file(str(target))
        tokenizer = cls(src, tgt, meta.get("src_lang"), meta.get("tgt_lang"), meta.get("config"))
        sizes = meta.get("vocab_sizes") or {}
        have = {"src": tokenizer.src_vocab_size, "tgt": tokenizer.tgt_vocab_size}
        if sizes and sizes != have:
            raise ValueError(
                f"{meta_path} describes vocabularies of sizes {sizes} but the files beside it "
                f"have {have}; the files come from different runs: copy them together."
            )
        return tokenizer

    def __repr__(self) -> str:
        kind = "joint" if self.joint else "separate"
        return (
            f"Tokenizer({self.src_lang}->{self.tgt_lang}, {kind}, "
            f"src_vocab_size={self.src_vocab_size}, tgt_vocab_size={self.tgt_vocab_size})"
        )


def _parse(text: str, where: str) -> dict[str, Any]:
    try:
        payload = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"{where} is not valid JSON: {err}") from None
    if not isinstance(payload, dict):
        raise ValueError(f"{where} is not a JSON object; it is not a tokenizer file.")
    return payload


def _check_version(payload: dict[str, Any]) -> None:
    if payload.get("version") != VERSION:
        raise ValueError(
            f"Tokenizer format version {payload.get('version')} is not supported "
            f"(this code reads version {VERSION})."
        )


def _chain(*streams: Iterable[list[str]]) -> Iterator[list[str]]:
    for stream in streams:
        yield from stream
