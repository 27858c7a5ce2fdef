"""``bucketed(model)``: a user's own ``model(**batch)`` loop at a few static shapes, with the unpadded results.

A padded length never changes a result, for every pooling a head does (first token, last non-pad
token, per-position outputs pooled afterwards under the mask) and for every decoder family of the
generation matrix; bad input gives the CPU's result or error.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from transformers import AutoModelForSequenceClassification, pipeline  # noqa: E402

import transformers_tpu_ext as ext  # noqa: E402
from transformers_tpu_ext.inference import bucketed, runtime  # noqa: E402
from transformers_tpu_ext.testing import tiny  # noqa: E402
from transformers_tpu_ext.testing.tiny_encoders import random_texts, tiny_bert_tokenizer, tiny_encoder  # noqa: E402

from _inference import steady  # noqa: E402


def _batch(tokenizer, texts):
    return dict(tokenizer(texts, padding=True, return_tensors="pt"))


def _mean(hidden, mask):
    weights = mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * weights).sum(1) / weights.sum(1)


def _pooled(model, batch):
    """What a user reads from each head: the row's scores, or the mean of its real tokens."""
    out = model(**batch)
    if "logits" in out:
        return out.logits.cpu()
    return _mean(out.last_hidden_state.cpu(), batch["attention_mask"].cpu())


def _classifier(arch: str):
    torch.manual_seed(0)
    config = tiny.tiny_config(arch, num_labels=3, pad_token_id=0)
    return AutoModelForSequenceClassification.from_config(config).eval()


POOLINGS = {
    "first token ([CLS])": lambda: tiny_encoder("sequence_classification"),
    "per position, mean under the mask afterwards": lambda: tiny_encoder("base"),
    "per position (token classification)": lambda: tiny_encoder("token_classification"),
    "last non-pad token (decoder classifier)": lambda: _classifier("qwen3"),
}


@pytest.mark.parametrize("pooling", list(POOLINGS))
def test_a_padded_length_never_changes_a_result(pooling):
    model = POOLINGS[pooling]()
    decoder = "decoder" in pooling
    tok = tiny.tiny_tokenizer() if decoder else tiny_bert_tokenizer()
    batch = _batch(tok, random_texts(3, seed=4, longest=12))
    length = batch["input_ids"].shape[1]
    with torch.no_grad():
        expected = _pooled(model, batch)
        if "token classification" in pooling:
            assert expected.shape[1] == length
        for padded in (length + 1, length + 9, 64):  # every length up to the position table
            calls = runtime.Bucketed(model, ladder=(padded,), on_tpu_only=False)
            with calls:
                got = _pooled(model, dict(batch, use_cache=False) if decoder else batch)
            assert calls.padded == 1 and calls.used == {padded}
            assert got.shape == expected.shape and torch.allclose(got, expected, atol=1e-5), padded
    assert not torch.allclose(expected[0], expected[1], atol=1e-3), "rows must differ for the test to mean anything"


@pytest.mark.parametrize("arch", [a for a in tiny.ARCHITECTURES if a != "glm4"])
def test_every_decoder_family_classifies_the_same_padded(arch):
    model = _classifier(arch)
    tok = tiny.tiny_tokenizer()
    batch = dict(_batch(tok, random_texts(3, seed=5, longest=10)), use_cache=False)
    with torch.no_grad():
        expected = model(**batch).logits
        calls = runtime.Bucketed(model, ladder=(batch["input_ids"].shape[1] + 11,), on_tpu_only=False)
        with calls:
            got = model(**batch).logits
    assert calls.padded == 1, calls.reasons
    assert torch.allclose(got, expected, atol=1e-5)


@pytest.mark.slow  # ~15 s: the first pass runs every op of the model eagerly at each bucket
def test_a_users_loop_reaches_a_steady_state_with_the_cpus_results(simulated_tpu):
    ext.activate()
    tok = tiny_bert_tokenizer()
    cpu_model, model = tiny_encoder("base"), tiny_encoder("base").to("tpu")
    texts = random_texts(48, seed=6, longest=30)
    first = [texts[:4]] + [["cake " * 45] * 4] + [texts[i:i + 4] for i in range(4, 24, 4)]
    second = [texts[i:i + 4] for i in range(24, 48, 4)] + [texts[:3], texts[3:4]]

    def embed(group):
        batch = _batch(tok, group)
        with torch.no_grad():
            got = _pooled(model, batch)  # CPU tensors in: padded on the host, then moved
            expected = _pooled(cpu_model, batch)
        assert torch.allclose(got, expected, atol=1e-5)

    with bucketed(model) as calls:
        for group in first + [texts[:3], texts[3:4]]:
            embed(group)
        with steady("the second pass of bucketed(model)"):
            for group in second:
                embed(group)
    assert calls.padded == len(first) + len(second) + 2 and not calls.reasons


def test_without_a_tpu_calls_are_upstreams():
    model = tiny_encoder("base")
    batch = _batch(tiny_bert_tokenizer(), ["a tpu", "static shapes avoid recompilation"])
    with bucketed(model) as calls:
        out = model(**batch)
    assert out.last_hidden_state.shape[1] == batch["input_ids"].shape[1]
    assert calls.padded == 0 and calls.reasons == {"the model is not on a TPU": 1}


@pytest.fixture
def tpu(simulated_tpu):
    import transformers.pipelines.base  # noqa: F401

    ext.activate()
    return simulated_tpu


def test_bad_input_gives_the_cpus_result_or_error(tpu):
    tok = tiny_bert_tokenizer()
    cpu = pipeline("text-classification", model=tiny_encoder("sequence_classification"), tokenizer=tok, device="cpu")
    pipe = pipeline("text-classification", model=tiny_encoder("sequence_classification"), tokenizer=tok, device="tpu")
    too_long = "the secret to baking a good cake is " * 12  # ~100 tokens: past the 64 positions
    texts = ["", "a", too_long]
    expected = cpu(texts, batch_size=2, truncation=True, top_k=None)
    got = pipe(texts, batch_size=2, truncation=True, top_k=None)
    assert [[r["label"] for r in row] for row in got] == [[r["label"] for r in row] for row in expected]
    assert all(abs(a["score"] - b["score"]) < 1e-5 for x, y in zip(got, expected) for a, b in zip(x, y))
    with pytest.raises(Exception) as on_cpu:
        cpu(too_long)
    with pytest.raises(type(on_cpu.value)):
        pipe(too_long)  # not padded (longer than the table): upstream's own error
    calls = runtime.for_model(pipe.model, drop_cache=True)
    assert any("longer than the model's 64 positions" in reason for reason in calls.reasons)


def test_the_registry_of_models_keeps_none_alive():
    import gc
    import weakref

    model = tiny_encoder("base")
    alive = weakref.ref(model)
    runtime.for_model(model, drop_cache=True)
    del model
    gc.collect()
    assert alive() is None


def test_another_threads_call_of_the_model_is_its_own(simulated_tpu):
    import threading

    model = tiny_encoder("base").to("tpu")
    batch = {k: v.to("tpu") for k, v in _batch(tiny_bert_tokenizer(), ["a tpu", "static shapes avoid it"]).items()}
    seen = {}
    with bucketed(model) as calls:
        inside = model(**batch).last_hidden_state.shape
        worker = threading.Thread(target=lambda: seen.update(shape=model(**batch).last_hidden_state.shape,
                                                             padded=calls.padded))
        before = calls.padded
        worker.start()
        worker.join()
    assert inside[1] == batch["input_ids"].shape[1] and before == 1
    assert seen == {"shape": inside, "padded": 1}  # the other thread's call was not planned nor padded
