"""Pipelines on the simulated TPU (patch ``pipeline_buckets``): the CPU's results, and a steady state.

Each pipeline runs a first pass of texts of random lengths (plus a group per length bucket), then a
second pass of other random texts in cache-only mode: it compiles nothing, and every result equals
plain Transformers on the CPU (same labels and order, scores within 1e-5).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from transformers import AutoModelForSequenceClassification, pipeline  # noqa: E402

import transformers_tpu_ext as ext  # noqa: E402
from transformers_tpu_ext.inference import runtime  # noqa: E402
from transformers_tpu_ext.testing import tiny  # noqa: E402
from transformers_tpu_ext.testing.tiny_encoders import WORDS, random_texts, tiny_bert_tokenizer, tiny_encoder  # noqa: E402

from _inference import assert_same, steady  # noqa: E402

pytestmark = pytest.mark.slow  # ~45 s in all: six pipelines, each on the CPU and on the TPU

BATCH = 4


def covering(tokenizer, texts, extra: str = "") -> list[str]:
    """A batch of texts per length bucket up to the longest of ``texts``: the first pass sees every bucket."""
    from transformers_tpu_ext.inference.policy import sequence_ladder
    from transformers_tpu_ext.ladders import round_up

    count = lambda text: len(tokenizer(text + extra)["input_ids"])  # noqa: E731
    ladder = sequence_ladder()
    top = round_up(max(count(t) for t in texts), ladder)
    groups, words, previous = [], [WORDS[0]], 0
    for rung in [r for r in ladder if r <= top]:
        while count(" ".join(words)) <= previous:
            words.append(WORDS[len(words) % len(WORDS)])
        assert count(" ".join(words)) <= rung
        groups += [" ".join(words)] * BATCH
        previous = rung
    return groups


@pytest.fixture
def tpu(simulated_tpu):
    import transformers.pipelines.base  # noqa: F401 - the patch's target

    ext.activate()
    assert "pipeline_buckets" in ext.active_patches()
    return simulated_tpu


def _run(task: str, make_model, tokenizer, first, second, **call):
    cpu = pipeline(task, model=make_model(), tokenizer=tokenizer, device="cpu")
    expected = cpu(first + second, batch_size=BATCH, **call)
    pipe = pipeline(task, model=make_model(), tokenizer=tokenizer, device="tpu")
    assert pipe.model.device.type == "tpu"
    got = pipe(first, batch_size=BATCH, **call)
    with steady(f"the second pass of {task}"):
        got += pipe(second, batch_size=BATCH, **call)
    assert runtime.for_model(pipe.model, drop_cache=True).padded > 0, "no call was padded"
    assert_same(got, expected)
    return got


def _texts(count: int, seed: int) -> list[str]:
    return random_texts(count, seed=seed, longest=30)


def test_text_classification_bert(tpu):
    tok, second = tiny_bert_tokenizer(), _texts(24, 2)
    got = _run("text-classification", lambda: tiny_encoder("sequence_classification"), tok,
               covering(tok, second) + _texts(16, 1), second, top_k=None)
    assert len({row[0]["label"] for row in got}) > 1, "a constant classifier proves nothing"


def test_text_classification_decoder(tpu):
    tok = tiny.tiny_tokenizer()  # left padding, pad id 0

    def make():
        torch.manual_seed(0)
        config = tiny.tiny_config("qwen3", num_labels=3, pad_token_id=0)
        return AutoModelForSequenceClassification.from_config(config).eval()

    second = random_texts(24, seed=2, longest=12)
    got = _run("text-classification", make, tok, covering(tok, second) + _texts(8, 1), second, top_k=None)
    assert len({row[0]["label"] for row in got}) > 1


def test_token_classification(tpu):
    tok, second = tiny_bert_tokenizer(), _texts(16, 4)
    _run("token-classification", lambda: tiny_encoder("token_classification"), tok, covering(tok, second) + _texts(8, 3), second)


def test_feature_extraction(tpu):
    tok, second = tiny_bert_tokenizer(), _texts(12, 6)
    _run("feature-extraction", lambda: tiny_encoder("base"), tok, covering(tok, second) + _texts(8, 5), second)


def test_fill_mask(tpu):
    masked = lambda texts: [f"{t} [MASK] tpu" for t in texts]  # noqa: E731
    tok, second = tiny_bert_tokenizer(), masked(_texts(16, 8))
    _run("fill-mask", lambda: tiny_encoder("masked_lm"), tok, masked(covering(tok, second, " [MASK] tpu") + _texts(8, 7)), second)


def test_zero_shot_classification(tpu):
    # Each text is paired with each label ("This example is {label}."): BATCH pairs per forward.
    labels = ["cake", "tpu"]
    tok, second = tiny_bert_tokenizer(), random_texts(8, seed=12, longest=20)
    first = covering(tok, second, " this example is tensor parallelism.")[::2] + random_texts(4, seed=11, longest=20)
    _run("zero-shot-classification", lambda: tiny_encoder("sequence_classification"), tok, first, second, candidate_labels=labels)


def test_zero_shot_classification_of_random_texts_settles_in_the_first_hundred(tpu):
    # bench_infer's workload: 200 random texts, 2 labels, 8 pairs (4 texts) per forward; no batch
    # chosen to cover the buckets. A batch of 8 pairs holds 4 texts only, so its longest varies more
    # than a text-classification batch's: texts 104-107 make a batch of 15 tokens, whose own rung
    # (16) the first hundred never ran. It pads to 48 (patience: once) instead of compiling in the second
    # hundred.
    texts, call = random_texts(200, seed=1, longest=30), {"candidate_labels": ["cake", "tpu"]}
    cpu = pipeline("zero-shot-classification", model=tiny_encoder("sequence_classification"), tokenizer=tiny_bert_tokenizer(),
                   device="cpu")
    expected = cpu(texts, batch_size=8, **call)
    pipe = pipeline("zero-shot-classification", model=tiny_encoder("sequence_classification"), tokenizer=tiny_bert_tokenizer(),
                    device="tpu")
    got = pipe(texts[:100], batch_size=8, **call)
    with steady("the second hundred texts of zero-shot classification"):
        got += pipe(texts[100:], batch_size=8, **call)
    calls = runtime.for_model(pipe.model, drop_cache=True)
    assert calls.deferred == {16: 1}, "the short batch this test is about did not happen"
    assert_same(got, expected)
    assert len({row["labels"][0] for row in got}) > 1
