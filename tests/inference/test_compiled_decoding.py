"""The torch engine's compiled decoding step: the same outputs as the plain engine."""

from __future__ import annotations

import pytest
import torch

from transformer_mt.errors import SettingError
from transformer_mt.inference.engine import TorchEngine, open_engine
from transformer_mt.inference.search import SearchConfig
from transformer_mt.model.transformer import Transformer

from conftest import BOS, EOS, FIXTURES, random_batch, tiny_config


def _outputs(engine: TorchEngine, src: torch.Tensor, search: SearchConfig) -> tuple:
    """The n-best tokens, and their scores as one tensor."""
    found = engine.decode_batch({"src": src}, search)
    tokens = [[h.tokens for h in hyps] for hyps in found]
    return tokens, torch.tensor([[h.score for h in hyps] for hyps in found])


@pytest.mark.slow
def test_compiled_engine_decodes_as_the_plain_engine() -> None:
    """Greedy and beam search, one sentence and several, batches of new sizes and lengths
    after the first (the compiled graph takes them without a new compile)."""
    torch.manual_seed(0)
    model = Transformer(tiny_config()).eval()
    plain = TorchEngine(model, bos_id=BOS, eos_id=EOS)
    compiled = TorchEngine(model, bos_id=BOS, eos_id=EOS, compile=True)
    compiled.warm_up()
    # One sentence greedy is the lone sentence's graph (MIN_ROWS rows), the rest the general one.
    for batch, src_len in ((5, 7), (1, 4), (3, 11), (8, 9), (2, 6), (1, 9)):
        src, _ = random_batch(batch=batch, src_len=src_len)
        for search in (SearchConfig(), SearchConfig(beam_size=3, nbest=2)):
            tokens, scores = _outputs(compiled, src, search)
            expected_tokens, expected_scores = _outputs(plain, src, search)
            assert tokens == expected_tokens
            torch.testing.assert_close(scores, expected_scores, atol=1e-4, rtol=1e-5)
    # The warm-up compiled both graphs (its first calls check every guard); no call has found
    # no graph since.
    assert compiled.steps is not None
    threads = torch.get_num_threads()
    assert compiled.steps[0]._checked == {("lone", threads), ("general", threads)}
    assert compiled.steps[0]._misses == {}


@pytest.mark.slow
def test_compiled_engines_of_one_shape_each_reach_their_own_graph() -> None:
    """Two models of one shape alone and as an ensemble: four compiled steps of one code, each
    lone sentence's graph with its model's weights frozen in. Every call reaches its own
    model's graph, also once the guards are skipped (the second round)."""
    torch.manual_seed(1)
    a, b = (Transformer(tiny_config()).eval() for _ in range(2))
    pairs = [
        (
            TorchEngine(m, bos_id=BOS, eos_id=EOS, compile=True),
            TorchEngine(m, bos_id=BOS, eos_id=EOS),
        )
        for m in (a, b, [a, b])
    ]
    # A lone sentence greedy reaches the graph whose weights are constants (the lone one).
    sources = [random_batch(batch=4, src_len=8)[0], random_batch(batch=1, src_len=8)[0]]
    for _ in range(2):
        for src in sources:
            for search in (SearchConfig(), SearchConfig(beam_size=3)):
                for compiled, plain in pairs:
                    tokens, scores = _outputs(compiled, src, search)
                    expected_tokens, expected_scores = _outputs(plain, src, search)
                    assert tokens == expected_tokens
                    torch.testing.assert_close(scores, expected_scores, atol=1e-4, rtol=1e-5)


def test_compile_refuses_int8_and_ctranslate2() -> None:
    model = Transformer(tiny_config()).eval()
    with pytest.raises(SettingError, match="compiled decoding step runs float weights"):
        TorchEngine(model, bos_id=BOS, eos_id=EOS, compute_type="int8", compile=True)
    with pytest.raises(SettingError, match="compile applies to the torch engine"):
        open_engine("ctranslate2", [], compile=True)


def test_warm_up_without_compile_does_nothing() -> None:
    engine = TorchEngine(Transformer(tiny_config()).eval(), bos_id=BOS, eos_id=EOS)
    engine.warm_up()
    assert engine.steps is None


@pytest.mark.slow
def test_a_compiled_service_translates_as_the_plain_one() -> None:
    """The service compiles before its first request and says so in ``GET /model``."""
    from transformer_mt.serve.model import ONE_THREAD_ROWS, ServedModel

    ckpt = FIXTURES / "format_v1" / "model.ckpt"
    lines = ["Zwei Männer stehen am Herd.", "Ein Hund.", ""]
    plain = ServedModel.open(ckpt)
    compiled = ServedModel.open(ckpt, compile=True)
    assert compiled.info()["compiled"] and not plain.info()["compiled"]
    # Compiled before the first request: the lone sentence's graph and the general one on the
    # small calls' one thread, the general one on the large calls' threads.
    large = compiled._threads_for(ONE_THREAD_ROWS)
    assert compiled.engine.steps[0]._checked == {("lone", 1), ("general", 1), ("general", large)}
    for beam in (1, 3):
        search = plain.search(beam_size=beam)
        assert [t.text for t in compiled.translate(lines, search)] == [
            t.text for t in plain.translate(lines, search)
        ]
