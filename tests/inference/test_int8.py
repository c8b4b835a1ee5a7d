"""The torch engine's int8 compute type: dynamic quantization of the linear layers."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from transformer_mt.data.numbers import number_sentences
from transformer_mt.errors import SettingError
from transformer_mt.inference.engine import TorchEngine, quantize_int8
from transformer_mt.inference.search import SearchConfig

from conftest import source_tensor, train_copy_model


@pytest.fixture(scope="module")
def copy_model():
    return train_copy_model(steps=300)


def outputs(engine: TorchEngine, src: torch.Tensor, search: SearchConfig) -> list[list[int]]:
    return [hyps[0].tokens for hyps in engine.decode_batch({"src": src}, search)]


@pytest.mark.parametrize("beam", [1, 4])
def test_int8_decodes_as_float32_does(copy_model, beam: int) -> None:
    """Held-out sentences of the copy task: int8 gives float32's output for most of them and
    copies about as many right. The model is tiny and half-trained, so many decisions are
    close and some move; a broken quantization agrees on none (the BLEU of a real model is
    measured in docs/benchmarks.md)."""
    tokenizer, model = copy_model
    en, _ = number_sentences(list(range(1, 1500, 7)), "en", "de", seed=1)
    src = source_tensor(tokenizer, en[:120])
    ids = dict(bos_id=tokenizer.bos_id, eos_id=tokenizer.eos_id)
    search = SearchConfig(beam_size=beam)
    plain = outputs(TorchEngine(model, **ids), src, search)
    int8 = outputs(TorchEngine(model, **ids, compute_type="int8"), src, search)
    same = sum(a == b for a, b in zip(plain, int8))
    assert same >= 0.7 * len(plain)
    reference = [tokenizer.encode_src_batch([s])[0] for s in en[:120]]
    copied = [sum(o == r for o, r in zip(out, reference)) for out in (plain, int8)]
    assert copied[1] >= copied[0] - 0.1 * len(reference)


def test_every_linear_layer_is_quantized_in_a_copy(copy_model) -> None:
    _, model = copy_model
    quantized = quantize_int8(model)
    assert not any(isinstance(m, nn.Linear) for m in quantized.modules())
    assert sum(isinstance(m, nn.Linear) for m in model.modules()) > 0  # the original is intact
    assert model.generator.weight is model.decoder.embedding.token.weight  # still tied


def test_an_unknown_compute_type_is_one_line(copy_model) -> None:
    _, model = copy_model
    with pytest.raises(SettingError, match=r"no compute type 'int4'; use compute_type=int8"):
        TorchEngine(model, bos_id=1, eos_id=2, compute_type="int4")


def test_translate_and_evaluate_run_int8(tiny_run_dir, tmp_path) -> None:
    from transformer_mt.cli.translate import main as translate_main

    from conftest import best_checkpoint, evaluate

    ckpt = best_checkpoint(tiny_run_dir)
    source = tmp_path / "in.en"
    source.write_text("seven apples\n\nforty-two houses\n", encoding="utf-8")
    out = tmp_path / "out.de"
    argv = ["--ckpt", str(ckpt), "--compute-type", "int8", "-i", str(source), "-o", str(out)]
    assert translate_main([*argv, "-q"]) == 0
    assert len(out.read_text(encoding="utf-8").split("\n")[:-1]) == 3
    results = evaluate(tmp_path / "eval", f"ckpt_path={ckpt}", "compute_type=int8")
    assert results["decoding"]["compute_type"] == "int8" and "bleu" in results["metrics"]
