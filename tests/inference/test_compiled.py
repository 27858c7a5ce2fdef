"""A padded inference forward runs as one compiled program per bucket (``inference.compiled``) on the simulated TPU.

In steady state each batch is a graph call and (almost) no eager operation, the second 100 texts compile
nothing (cache-only mode), and the results are the CPU's within 1e-5; what cannot be compiled runs op by op,
padded all the same, said once at WARNING.
"""

from __future__ import annotations

import logging

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from transformers import pipeline  # noqa: E402

import transformers_tpu_ext as ext  # noqa: E402
from transformers_tpu_ext.inference import bucketed, runtime  # noqa: E402
from transformers_tpu_ext.testing.tiny_encoders import random_texts, tiny_bert_tokenizer, tiny_encoder  # noqa: E402

from _inference import TOLERANCE, assert_same, steady  # noqa: E402

BATCH = 8
#: Eager operations a steady-state batch may run on the TPU besides its graph (the issue's bound).
EAGER_PER_BATCH = 5


@pytest.fixture
def tpu(simulated_tpu):
    import transformers.pipelines.base  # noqa: F401 - the patch's target

    ext.activate()
    return simulated_tpu


def _per_batch(delta, batches: int) -> dict:
    return {"graph_calls": delta.graph_calls / batches, "eager_ops": delta.eager_ops / batches, "programs": delta.programs}


TASKS = {
    "text-classification": ("sequence_classification", lambda t: t, {"top_k": None}),
    "token-classification": ("token_classification", lambda t: t, {}),
    "fill-mask": ("masked_lm", lambda t: [f"{s} [MASK] tpu" for s in t], {}),
    "feature-extraction": ("base", lambda t: t, {}),
}


@pytest.mark.slow  # ~10 s each: 200 texts on the CPU and on the TPU
@pytest.mark.parametrize("task", list(TASKS))
def test_a_pipeline_runs_one_graph_per_batch_with_the_cpus_results(tpu, task):
    kind, transform, call = TASKS[task]
    tok = tiny_bert_tokenizer()
    first, second = transform(random_texts(100, seed=1, longest=30)), transform(random_texts(100, seed=2, longest=30))
    cpu = pipeline(task, model=tiny_encoder(kind), tokenizer=tok, device="cpu")
    # two calls, as on the TPU: feature extraction's vectors include the pipeline's own padding of each batch
    expected = cpu(first, batch_size=BATCH, **call) + cpu(second, batch_size=BATCH, **call)
    pipe = pipeline(task, model=tiny_encoder(kind), tokenizer=tok, device="tpu")
    ext.warmup(pipe, work="infer", max_length=48, max_batch_size=BATCH, **call)
    got = pipe(first, batch_size=BATCH, **call)
    before = tpu.counters()
    with steady(f"the second 100 texts of {task}"):
        got += pipe(second, batch_size=BATCH, **call)
    seen = _per_batch(tpu.counters() - before, batches=-(-100 // BATCH))
    assert seen["programs"] == 0
    assert seen["graph_calls"] == 1 and seen["eager_ops"] <= EAGER_PER_BATCH, seen
    calls = runtime.for_model(pipe.model, drop_cache=True)
    assert calls.compiled > 0 and not calls.eager_reasons, calls.eager_reasons
    assert_same(got, expected)


def _loop(model, tok, texts):
    out = []
    for start in range(0, len(texts), BATCH):
        batch = dict(tok(texts[start:start + BATCH], padding=True, return_tensors="pt"))
        hidden = model(**batch).last_hidden_state.cpu()
        mask = batch["attention_mask"].unsqueeze(-1)
        out.append((hidden * mask).sum(1) / mask.sum(1))
    return torch.cat(out)


def _users_loop(tpu, compile: bool):
    tok = tiny_bert_tokenizer()
    first, second = random_texts(100, seed=3, longest=30), random_texts(100, seed=4, longest=30)
    with torch.no_grad():
        expected = _loop(tiny_encoder("base").eval(), tok, first + second)
    model = tiny_encoder("base").eval().to("tpu")
    with bucketed(model, compile=compile) as calls, torch.no_grad():
        got = [_loop(model, tok, first)]
        before = tpu.counters()
        with steady("the second 100 texts of a user's loop"):
            got.append(_loop(model, tok, second))
        seen = _per_batch(tpu.counters() - before, batches=-(-100 // BATCH))
    assert float((torch.cat(got) - expected).abs().max()) <= TOLERANCE
    return seen, calls


@pytest.mark.slow
def test_a_users_loop_runs_one_graph_per_batch(tpu):
    seen, calls = _users_loop(tpu, compile=True)
    assert seen["programs"] == 0 and seen["graph_calls"] == 1 and seen["eager_ops"] <= EAGER_PER_BATCH, seen
    assert calls.compiled == calls.padded > 0


@pytest.mark.slow
def test_compile_false_runs_each_operation_as_a_program(tpu):
    # The contrast: the same loop op by op launches dozens of programs per batch (all compiled already).
    seen, calls = _users_loop(tpu, compile=False)
    assert seen["programs"] == 0 and seen["graph_calls"] == 0 and seen["eager_ops"] > 20, seen
    assert calls.compiled == 0 and list(calls.eager_reasons) == ["compiling is switched off (bucketed(model, compile=False))"]


def _few(model, tok, texts):
    with torch.no_grad():
        return model(**dict(tok(texts, padding=True, return_tensors="pt"))).last_hidden_state.cpu()


def test_a_hook_of_yours_runs_op_by_op_said_once(tpu, caplog):
    tok, texts = tiny_bert_tokenizer(), random_texts(6, seed=5, longest=12)
    cpu = tiny_encoder("base").eval()
    model = tiny_encoder("base").eval().to("tpu")
    seen = []
    model.encoder.layer[0].register_forward_hook(lambda module, args, output: seen.append(1))
    with caplog.at_level(logging.WARNING, logger="transformers_tpu_ext"), bucketed(model) as calls:
        for _ in range(2):
            before = tpu.counters()
            got = _few(model, tok, texts)
        delta = tpu.counters() - before
    assert seen == [1, 1], "the hook runs at every call"
    assert calls.compiled == 0 and delta.graph_calls == 0 and delta.eager_ops > 20
    said = [r.getMessage() for r in caplog.records if "runs op by op" in r.getMessage()]
    assert len(said) == 1 and "1 forward hook on the model" in said[0]
    assert float((got - _few(cpu, tok, texts)).abs().max()) <= TOLERANCE


def test_a_forward_that_breaks_the_graph_runs_op_by_op_said_once(tpu, caplog, monkeypatch):
    tok, texts = tiny_bert_tokenizer(), random_texts(6, seed=6, longest=12)
    cpu = tiny_encoder("base").eval()
    model = tiny_encoder("base").eval().to("tpu")
    layer = type(model.encoder.layer[0])
    forward = layer.forward

    def data_dependent(self, hidden_states, *args, **kwargs):
        if float(hidden_states.abs().sum()) < 0:  # a Python branch on a value: a graph break
            hidden_states = hidden_states * 2
        return forward(self, hidden_states, *args, **kwargs)

    monkeypatch.setattr(layer, "forward", data_dependent)
    with caplog.at_level(logging.WARNING, logger="transformers_tpu_ext"), bucketed(model) as calls:
        got = [_few(model, tok, texts) for _ in range(3)][-1]
    assert calls.compiled == 0 and calls.padded == 3 and calls.graph_breaks
    said = [r.getMessage() for r in caplog.records if "runs op by op" in r.getMessage()]
    assert len(said) == 1 and "breaks the graph" in said[0]
    assert float((got - _few(cpu, tok, texts)).abs().max()) <= TOLERANCE


def test_a_new_bucket_in_cache_only_mode_fails_rather_than_running_eagerly(tpu):
    from transformers_tpu_ext.testing.programs import NewProgramsError, cache_only

    tok = tiny_bert_tokenizer()
    model = tiny_encoder("base").eval().to("tpu")
    with bucketed(model) as calls:
        _few(model, tok, ["a b c"])
        with pytest.raises(NewProgramsError), cache_only("a bucket never run"):
            _few(model, tok, [" ".join(["a"] * 40)])
    assert calls.compiled == 1 and not calls.graph_breaks
