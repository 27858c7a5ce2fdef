"""sentence-transformers ``encode()`` on the simulated TPU through ``bucketed(model)``: the CPU's
embeddings (each pooling mode) and a steady state; models with modules that could read the padding
run as they are."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("sentence_transformers")

from sentence_transformers import SentenceTransformer  # noqa: E402
from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer  # noqa: E402

import transformers_tpu_ext as ext  # noqa: E402
from transformers_tpu_ext.inference import bucketed, policy  # noqa: E402
from transformers_tpu_ext.testing.tiny_encoders import random_texts, tiny_bert_tokenizer, tiny_encoder  # noqa: E402

from _inference import steady  # noqa: E402


@pytest.fixture(scope="module")
def encoder_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("bert")
    tiny_encoder("base").save_pretrained(path)
    tiny_bert_tokenizer().save_pretrained(path)
    return str(path)


def _model(path: str, mode: str, device: str) -> SentenceTransformer:
    modules = [Transformer(path, max_seq_length=64), Pooling(32, pooling_mode=mode), Normalize()]
    return SentenceTransformer(modules=modules, device=device).eval()


@pytest.fixture
def no_inference_mode(monkeypatch):
    """encode() runs under torch.inference_mode(), in which the simulated TPU cannot slice a tensor made
    outside it (BERT's position-ids buffer: "Cannot set version_counter for inference tensor", with or
    without the plugin): the same methods, undecorated, under no_grad."""
    import inspect

    for name in ("encode", "_inference"):  # every wrapper off, the plugin's sentence_transformers_encode too
        monkeypatch.setattr(SentenceTransformer, name, inspect.unwrap(getattr(SentenceTransformer, name)))


def _encode(model, texts):
    with torch.no_grad():  # numpy out (the default): each batch's embeddings come to the host as they are made
        return torch.from_numpy(model.encode(texts, batch_size=4))


@pytest.mark.slow  # ~10 s each: the first pass runs every op of the model eagerly at each bucket
@pytest.mark.parametrize("mode", ["cls", "mean", "lasttoken"])  # the others weigh the tokens by the mask too
def test_encode_gives_the_cpus_embeddings_at_steady_state(simulated_tpu, no_inference_mode, encoder_dir, mode):
    ext.activate()
    texts = random_texts(24, seed=3, longest=30)
    first = texts[:16] + ["cake " * 55] * 4  # the longest bucket: 57 tokens with [CLS] and [SEP]
    cpu = _model(encoder_dir, mode, "cpu")
    model = _model(encoder_dir, mode, "tpu")
    with bucketed(model) as calls:
        got = _encode(model, first)
        assert calls.padded > 0 and not calls.reasons, calls.reasons
        with steady(f"encode() with {mode} pooling"):
            more = _encode(model, texts[16:])
    assert calls.padded > 0 and not calls.reasons
    expected = _encode(cpu, first + texts[16:])
    assert torch.allclose(torch.cat([got, more]), expected, atol=1e-5)
    assert not torch.allclose(expected[0], expected[1], atol=1e-3)


def test_unknown_modules_run_as_they_are():
    inner = policy.ModelFacts(task="base", pooling="none")
    assert policy.encoder_facts([("Transformer", ()), ("Pooling", ("mean",))], inner) is inner
    assert "LSTM" in policy.encoder_facts([("Transformer", ()), ("LSTM", ()), ("Pooling", ("mean",))], inner)
    assert "not known" in policy.encoder_facts([("Transformer", ()), ("Pooling", ("median",))], inner)
    assert "base model" in policy.encoder_facts([("Transformer", ()), ("Pooling", ("cls",))], policy.ModelFacts(task="masked_lm"))


@pytest.fixture
def patched_encode_without_inference_mode():
    """The ``sentence_transformers_encode`` patch over ``encode()`` undecorated (see ``no_inference_mode``):
    the originals replaced while the plugin is off, so that activating it wraps them; restored after."""
    import inspect

    ext.deactivate()
    saved = {name: SentenceTransformer.__dict__[name] for name in ("encode", "_inference")}
    for name, method in saved.items():
        setattr(SentenceTransformer, name, inspect.unwrap(method))
    ext.activate()
    try:
        yield
    finally:
        ext.deactivate()
        for name, method in saved.items():
            setattr(SentenceTransformer, name, method)
        ext.activate()


@pytest.mark.slow  # ~10 s each, as above
@pytest.mark.parametrize("mode", ["mean", "cls", "lasttoken"])
def test_plain_encode_on_the_tpu_is_bucketed_without_asking(simulated_tpu, patched_encode_without_inference_mode, encoder_dir, mode):
    assert "sentence_transformers_encode" in ext.active_patches()
    texts = random_texts(200, seed=5, longest=30)
    cpu = _model(encoder_dir, mode, "cpu")
    model = _model(encoder_dir, mode, "tpu")  # SentenceTransformer(..., device="tpu"), nothing else
    got = _encode(model, texts[:100])
    with steady(f"the second 100 texts of a plain encode() with {mode} pooling"):
        more = _encode(model, texts[100:])
    calls = bucketed(model)
    assert calls.padded > 0 and not calls.reasons, calls.reasons
    expected = _encode(cpu, texts)
    assert float((torch.cat([got, more]) - expected).abs().max()) <= 1e-5
    assert not torch.allclose(expected[0], expected[1], atol=1e-3)


@pytest.mark.slow
def test_plain_encode_runs_one_graph_per_batch_after_its_warmup(simulated_tpu, patched_encode_without_inference_mode, encoder_dir):
    texts = random_texts(200, seed=7, longest=30)
    cpu = _model(encoder_dir, "mean", "cpu")
    model = _model(encoder_dir, "mean", "tpu")
    ext.warmup(model, work="infer", max_length=48, max_batch_size=4)  # encode()'s batch_size below
    got = _encode(model, texts[:100])
    before = simulated_tpu.counters()
    with steady("the second 100 texts of encode()"):
        more = _encode(model, texts[100:])
    delta = simulated_tpu.counters() - before
    batches = 100 // 4
    assert delta.programs == 0 and delta.graph_calls == batches and delta.eager_ops <= 5 * batches, delta
    calls = bucketed(model)
    assert calls.compiled > 0 and not calls.eager_reasons, calls.eager_reasons
    assert float((torch.cat([got, more]) - _encode(cpu, texts)).abs().max()) <= 1e-5
