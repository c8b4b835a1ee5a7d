"""The checkpoint format (write, safe read, build model) and its errors; averaging checkpoints."""

from __future__ import annotations

import pathlib
from pathlib import Path

import pytest
import torch

from transformer_mt.checkpoint import (
    CHECKPOINT_KEY,
    CheckpointError,
    UnsafeCheckpointError,
    load_checkpoint,
    load_model,
    save_checkpoint,
    write_metadata,
)
from transformer_mt.cli.translate import main as translate_main
from transformer_mt.data.tokenizer import Tokenizer
from transformer_mt.inference.averaging import average_checkpoints
from transformer_mt.model.transformer import Transformer

from conftest import (
    DATA_OVERRIDES,
    best_checkpoint,
    evaluate,
    load_script,
    tiny_config,
    train_tiny_run,
)


class Touch:
    """Unpickling this would create a file: the code-execution canary."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (pathlib.Path.touch, (pathlib.Path(self.marker),))


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return train_tiny_run(tmp_path_factory.getbasetemp() / "tiny_run")


@pytest.fixture(scope="module")
def ckpt(run_dir: Path) -> Path:
    return best_checkpoint(run_dir)


def test_written_format_round_trips(tmp_path: Path) -> None:
    """What write_metadata puts in, load_model reads back: model, tokenizer, languages, options."""
    tokenizer = Tokenizer.train([["a b c d e f", "g h i"]], [["a b c", "d e"]], vocab_size=270)
    config = tiny_config(
        src_vocab_size=tokenizer.src_vocab_size,
        tgt_vocab_size=tokenizer.tgt_vocab_size,
        pad_id=tokenizer.pad_id,
    )
    model = Transformer(config)
    checkpoint = {"state_dict": {f"model.{k}": v for k, v in model.state_dict().items()}}
    entry = write_metadata(
        checkpoint,
        config,
        tokenizer,
        src_lang="en",
        tgt_lang="de",
        decoding={"beam_size": 3},
        data={"source": "generated"},
    )
    assert checkpoint[CHECKPOINT_KEY] is entry
    loaded = load_model(save_checkpoint(checkpoint, tmp_path / "written.ckpt"))
    assert loaded.config == config
    assert (loaded.src_lang, loaded.tgt_lang) == ("en", "de")
    assert loaded.decoding == {"beam_size": 3} and loaded.data == {"source": "generated"}
    assert loaded.tokenizer.to_json() == tokenizer.to_json()
    for key, value in model.state_dict().items():
        assert torch.equal(loaded.model.state_dict()[key], value), key


def test_trainer_writes_the_format(ckpt: Path) -> None:
    """The training module writes its checkpoints through write_metadata, plus its RNG state."""
    written = load_checkpoint(ckpt)[CHECKPOINT_KEY]
    config = load_model(ckpt).config
    expected = write_metadata({}, config, Tokenizer.from_json(written["tokenizer"]))
    assert set(written) == set(expected) | {"torch_rng_state"}
    assert written["model_config"] == expected["model_config"]
    assert written["format"] == expected["format"]


def test_trainer_stores_each_config_once(ckpt: Path) -> None:
    """Model config, decoding and data settings live in the transformer_mt entry only."""
    checkpoint = load_checkpoint(ckpt)
    assert "hyper_parameters" not in checkpoint
    written = checkpoint[CHECKPOINT_KEY]
    assert written["data"]["src_lang"] == written["src_lang"] == "en"
    assert set(written["decoding"]) == {
        "beam_size",
        "length_penalty",
        "length_norm",
        "max_len_a",
        "max_len_b",
        "nbest",
        "sampling_topk",
        "sampling_topp",
        "temperature",
        "seed",
    }


FIXTURE_V1 = Path(__file__).resolve().parent / "fixtures" / "format_v1" / "model.ckpt"

#: What TranslationModule.save_hyperparameters added to every checkpoint before the module
#: took typed configs: the model config a second time, and its constructor arguments.
HYPER_PARAMETERS_OF_EARLIER_CODE = {
    "warmup_steps": 400,
    "label_smoothing": 0.1,
    "lr_schedule": "inverse_sqrt",
    "decoding": {"beam_size": 1, "length_penalty": 0.6, "max_len_a": 1.2, "max_len_b": 10},
    "num_examples": 3,
    "nonfinite_loss": "stop",
    "src_lang": "en",
    "tgt_lang": "de",
}


def test_checkpoint_with_earlier_hyper_parameters_loads_the_same_model(tmp_path: Path) -> None:
    checkpoint = load_checkpoint(FIXTURE_V1)
    earlier = dict(checkpoint)
    earlier["hyper_parameters"] = {
        "model_config": checkpoint[CHECKPOINT_KEY]["model_config"],
        **HYPER_PARAMETERS_OF_EARLIER_CODE,
    }
    save_checkpoint(earlier, tmp_path / "earlier.ckpt")
    fixture, loaded = load_model(FIXTURE_V1), load_model(tmp_path / "earlier.ckpt")
    assert loaded.config == fixture.config and loaded.decoding == fixture.decoding
    src = torch.tensor([[5, 6, 7, 2]])
    tgt = torch.tensor([[1, 8, 9]])
    assert torch.equal(loaded.model(src, tgt), fixture.model(src, tgt))


def test_malicious_checkpoint_is_refused(ckpt: Path, tmp_path: Path, capsys) -> None:
    marker = tmp_path / "pwned"
    evil = tmp_path / "evil.ckpt"
    state = load_checkpoint(ckpt)
    state["state_dict"]["model.evil"] = Touch(marker)  # type: ignore[assignment]
    torch.save(state, evil)
    with pytest.raises(UnsafeCheckpointError, match="refusing to load"):
        evaluate(tmp_path, f"ckpt_path={evil}")
    assert translate_main(["--ckpt", str(evil)]) == 2
    assert "refusing to load" in capsys.readouterr().err
    assert not marker.exists()


def test_error_messages(ckpt: Path, tmp_path: Path) -> None:
    good = load_checkpoint(ckpt)
    cases: dict[str, tuple[object, str]] = {}

    text = tmp_path / "notes.ckpt"
    text.write_text("not a checkpoint\n")
    cases["text"] = (text, "not a PyTorch checkpoint")

    data = ckpt.read_bytes()
    truncated = tmp_path / "truncated.ckpt"
    truncated.write_bytes(data[: len(data) // 2])
    cases["truncated"] = (truncated, "truncated or corrupted")

    flipped = bytearray(data)
    middle = len(flipped) // 2
    flipped[middle : middle + 64] = bytes(b ^ 0xFF for b in flipped[middle : middle + 64])
    corrupted = tmp_path / "corrupted.ckpt"
    corrupted.write_bytes(bytes(flipped))
    cases["corrupted"] = (corrupted, "corrupted")

    other = {**good, "state_dict": {"model.encoder.other.weight": torch.zeros(2)}}
    cases["other model"] = (save_checkpoint(other, tmp_path / "other.ckpt"), "another model")

    plain = {k: v for k, v in good.items() if k != "transformer_mt"}
    cases["not ours"] = (save_checkpoint(plain, tmp_path / "plain.ckpt"), "not from transformer-mt")

    small = Tokenizer.train([["a b c d e f", "g h i"]], [["a b c", "d e"]], vocab_size=270)
    wrong_vocab = {
        **good,
        "transformer_mt": {**good["transformer_mt"], "tokenizer": small.to_json()},
    }
    cases["vocab"] = (save_checkpoint(wrong_vocab, tmp_path / "vocab.ckpt"), "vocabulary has")

    cases["missing"] = (tmp_path / "missing.ckpt", "does not exist")
    for name, (path, message) in cases.items():
        with pytest.raises(CheckpointError) as info:
            load_model(path)  # type: ignore[arg-type]
        text_ = str(info.value)
        assert message in text_, (name, text_)
        assert "\n" not in text_, name


def test_average_of_copies_is_identity(ckpt: Path, tmp_path: Path) -> None:
    averaged = average_checkpoints([ckpt, ckpt])
    original = load_checkpoint(ckpt)["state_dict"]
    for key, value in original.items():
        assert torch.equal(averaged["state_dict"][key], value), key
    # The average is no training run: it names its sources and carries no resume state.
    assert averaged[CHECKPOINT_KEY]["averaged_from"] == [str(ckpt), str(ckpt)]
    assert "torch_rng_state" not in averaged[CHECKPOINT_KEY]


def test_average_of_two_is_the_mean(run_dir: Path, tmp_path: Path) -> None:
    paths = load_script("average_checkpoints").select_checkpoints(run_dir, 2, "last")
    sources = [load_checkpoint(p) for p in paths]
    a, b = (source["state_dict"] for source in sources)
    assert any(not torch.equal(a[k], b[k]) for k in a)
    # Dated by its latest source, step and epoch alike, whatever the order it was given.
    latest = max(sources, key=lambda c: c["global_step"])
    date = (latest["global_step"], latest["epoch"])
    assert sources[0]["epoch"] != sources[1]["epoch"]  # one of the two orders starts early
    for order in (paths[::-1], paths):
        average = average_checkpoints(order)
        assert (average["global_step"], average["epoch"]) == date
    out = save_checkpoint(average, tmp_path / "avg.ckpt")
    averaged = load_checkpoint(out)["state_dict"]
    for key in a:
        if a[key].is_floating_point():
            torch.testing.assert_close(averaged[key], (a[key] + b[key]) / 2)
    # The average is a full checkpoint: it loads, evaluates and translates.
    loaded = load_model(out)
    assert loaded.tokenizer.src_vocab_size == loaded.config.src_vocab_size
    results = evaluate(tmp_path, f"ckpt_path={out}", "data=numbers", *DATA_OVERRIDES)
    assert results["n_sentences"] == 40


def test_select_best_and_last(run_dir: Path) -> None:
    last = load_script("average_checkpoints").select_checkpoints(run_dir, 1, "last")
    assert len(last) == 1
    best = load_script("average_checkpoints").select_checkpoints(run_dir, 1, "best")
    assert best[0].suffix == ".ckpt"
    with pytest.raises(CheckpointError, match="fewer than"):
        load_script("average_checkpoints").select_checkpoints(run_dir, 99, "last")
