"""Sampling parameters per request in continuous batching on TPU (``serving.sampling``, issue 25).

The predicate and the processor list it builds are plain data (millisecond tests); what the
per-request processors compute is compared with ``generate()``'s on CPU; the end-to-end proof is a
``transformers-tpu warmup MODEL --serve`` of a model whose generation config samples, then a fresh
process serving requests of other temperatures, top-p and top-k in cache-only mode.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from transformers_tpu_ext.serving import sampling

T, K, P = "TemperatureLogitsWarper", "TopKLogitsWarper", "TopPLogitsWarper"


def test_the_predicate_turns_per_request_on_for_a_tpu_manager_that_samples():
    assert sampling.per_request_path(sampling.SamplingFacts(True, True, (T, K, P)))[0]
    assert sampling.per_request_path(sampling.SamplingFacts(True, True, ()))[0]  # completed below
    greedy = sampling.per_request_path(sampling.SamplingFacts(True, False, ()))
    assert not greedy[0] and "greedy" in greedy[1]
    assert not sampling.per_request_path(sampling.SamplingFacts(False, True, (T,)))[0]
    assert not sampling.per_request_path(sampling.SamplingFacts(True, True, (T,), upstream_classes=False))[0]


@pytest.mark.parametrize(
    "given, built",
    [
        ((T, K, P), (0, 1, 2)),
        ((K, P), (T, 0, 1)),  # a first request of temperature=1.0
        ((T, K), (0, 1, P)),  # top_p=1.0
        ((K,), (T, 0, P)),
        ((), (T, P)),
        (("RepetitionPenaltyLogitsProcessor", K, "MinPLogitsWarper"), (0, T, 1, P, 2)),
        (("NoRepeatNGramLogitsProcessor", "LogitNormalization"), (0, T, P, 1)),
        (("TopHLogitsWarper", P), (T, 0, 1)),
    ],
)
def test_the_identity_processors_go_where_generate_puts_them(given, built):
    assert sampling.completed(given) == built


def test_the_docs_table_is_the_predicates():
    text = (Path(__file__).resolve().parents[2] / "docs" / "serving.md").read_text()
    begin = text.index(sampling.BEGIN) + len(sampling.BEGIN)
    assert text[begin : text.index(sampling.END, begin)].strip() == sampling.path_table()


def _request(**kwargs):
    return SimpleNamespace(state=SimpleNamespace(logit_processor_kwargs=kwargs))


def _per_request(processor, rows, **kwargs):
    from transformers.generation.continuous_batching import cb_logits_processors as cb

    converted = {cls: cb_cls for cls, cb_cls in cb.CLASSIC_TO_CB_PROCESSORS_MAP.items()}[type(processor)](processor)
    return converted, converted.prepare_tensor_args([_request(**kwargs)] * rows)


def test_temperature_and_top_k_per_request_compute_what_generate_computes():
    import torch
    from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    gen = torch.Generator().manual_seed(0)
    for trial in range(12):
        scores = torch.randn(3, 500, generator=gen) * (1 + trial % 5)
        scores[0, :7] = scores[0, 7]  # ties at the threshold
        temperature, k, p = 0.05 + 2 * float(torch.rand(1, generator=gen)), 1 + 2 * trial, 0.05 + 0.9 * trial / 12
        for processor in (TemperatureLogitsWarper(temperature), TopKLogitsWarper(k), TopPLogitsWarper(p)):
            converted, args = _per_request(processor, 3)
            assert torch.equal(converted(scores, args), processor(None, scores)), processor
    # The identity processors the plugin adds change no score: x / 1.0; top-p 1.0 drops only tokens
    # whose probability is 0 in float32 (here: the ones top-k set to -inf).
    scores = TopKLogitsWarper(20)(None, torch.randn(3, 500, generator=gen) * 30)
    for processor in (TemperatureLogitsWarper(1.0), TopPLogitsWarper(1.0)):
        converted, args = _per_request(processor, 3)
        assert torch.equal(converted(scores, args), scores)


def test_top_p_per_request_rounds_its_threshold_in_float32():
    """Upstream's per-request top-p computes ``1 - top_p`` from a float32 top_p (0.100000024 for 0.9);
    generate()'s rounds the float64 ``1 - 0.9`` to float32 (0.100000001): a token whose cumulative
    probability lies between the two is kept by one and dropped by the other (docs/serving.md)."""
    import torch
    from transformers.generation.logits_process import TopPLogitsWarper

    scores = torch.tensor([[0.0, 2.1972243785858154]])  # softmax: 0.10000001639, 0.89999998
    assert 0.10000000149 < scores.softmax(-1)[0, 0].item() <= 0.10000002384
    converted, args = _per_request(TopPLogitsWarper(0.9), 1)
    assert TopPLogitsWarper(0.9)(None, scores)[0, 0].item() == 0.0  # generate(): kept
    assert converted(scores, args)[0, 0].item() == float("-inf")  # per request: dropped


def _processors(model, **config):
    import torch
    from transformers import GenerationConfig

    manager = model.init_continuous_batching(generation_config=GenerationConfig(**config))
    try:
        processors = manager.logit_processor
        defaults = torch.empty((processors.tensors_required, 1), dtype=torch.int32)
        processors.fill_defaults(defaults)
        values = [row.view(torch.float32).item() if "TopK" not in type(p).__name__ else row.item()
                  for row, p in zip(defaults, processors.logits_processor)]
        return [type(p).__name__.replace("ContinuousBatching", "").replace("LogitsWarper", "")
                for p in processors.logits_processor], values
    finally:
        manager.destroy()


def test_a_tpu_manager_that_samples_builds_per_request_processors(simulated_tpu):
    from transformers_tpu_ext.testing.tiny import tiny_model

    model = tiny_model("qwen3")
    qwen3 = dict(do_sample=True, temperature=0.6, top_k=20, top_p=0.95)
    assert _processors(model, **qwen3) == (["Temperature", "TopK", "TopP"], [])  # on the CPU: upstream's
    model.to("tpu")
    assert _processors(model, **qwen3) == (["Temperature", "TopK", "TopP"], [0.6000000238418579, 20, 0.949999988079071])
    # A first request of temperature=1, top_p=1: the same kinds, identity values.
    assert _processors(model, do_sample=True, temperature=1.0, top_k=20, top_p=1.0) == (
        ["Temperature", "TopK", "TopP"], [1.0, 20, 1.0])
    assert _processors(model, do_sample=False) == ([], [])  # greedy: untouched


def test_a_manager_whose_planning_fails_gets_upstreams_processors_back(simulated_tpu, monkeypatch):
    """Upstream builds the processors before the config the plugin plans; when planning fails the manager
    runs unpatched, and so do its processors (not the per-request ones the plugin chose for its plan)."""
    from transformers_tpu_ext.serving import patch_continuous_batching as glue
    from transformers_tpu_ext.testing.tiny import tiny_model

    def broken(*args, **kwargs):
        raise RuntimeError("a bug of the plan")

    monkeypatch.setattr(glue, "_plan_manager", broken)
    model = tiny_model("qwen3").to("tpu")
    assert _processors(model, do_sample=True, temperature=0.6, top_k=20, top_p=0.95) == (
        ["Temperature", "TopK", "TopP"], [])  # upstream's: the values stay in the processors


def _env(**changes: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRANSFORMERS_TPU_EXT_", "TORCH_TPU_"))}
    env.update(HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1", **changes)
    return env


SERVICE = Path(__file__).with_name("serving_sampling_worker.py")


@pytest.mark.slow
def test_a_fresh_process_after_warmup_serve_runs_any_sampling_values_from_the_cache(tmp_path):
    from transformers import GenerationConfig

    from transformers_tpu_ext.testing.tiny import save_tiny_model

    path = str(save_tiny_model(tmp_path / "tiny"))
    # The model's own generation config samples, as Qwen3's does.
    GenerationConfig(do_sample=True, temperature=0.6, top_k=20, top_p=0.95, eos_token_id=1, pad_token_id=0).save_pretrained(path)
    env = _env(TRANSFORMERS_TPU_EXT_SIMULATE="chips=1,hbm=96MiB", TRANSFORMERS_TPU_EXT_COMPILE_CACHE=str(tmp_path / "cache"),
               TRANSFORMERS_TPU_EXT_SERVE_MAX_BATCH_TOKENS="32", TRANSFORMERS_TPU_EXT_SERVE_MAX_REQUESTS="8")
    warm = subprocess.run([sys.executable, "-m", "transformers_tpu_ext.cli", "warmup", path, "--serve", "--json"],
                          capture_output=True, text=True, env=env, timeout=900)
    assert warm.returncode == 0, warm.stderr[-3000:]
    assert json.loads(warm.stdout[warm.stdout.index("{"):])["programs"]["compiled"] > 0

    service = subprocess.run([sys.executable, str(SERVICE), path], capture_output=True, text=True,
                             env=env, timeout=900)
    assert service.returncode == 0, service.stderr[-3000:]
    r = json.loads(service.stdout.split("@@", 1)[1])
    assert r["greedy_differ"]  # the tiny model is context-sensitive
    # The first request's temperature and top-p are not in the programs: start() loads, compiles nothing.
    assert r["started_compiled"] == 0 and r["started_loaded"] > 0
    assert r["served_error"] is None and r["served_compiled"] == 0
    assert r["neutral_error"] is None and r["neutral_compiled"] == 0
    assert r["sampled_lengths"] == [6, 6, 6]
    # top_k=1 is deterministic: upstream's greedy tokens on CPU, whatever the temperature.
    assert r["argmax_is_greedy"]
    # The temperature reaches the step: at 0.05 every draw is the argmax, at 8.0 they spread.
    assert set(r["cold_first"]) == {r["greedy_first"]}
    assert len(set(r["hot_first"])) >= 4
