"""Pipelines keep a TPU model on the TPU (patch ``transformers_pipeline``).

Upstream, a pipeline built without ``device`` moves its model to ``cuda:0``/... or, on a TPU host,
to the CPU: a model loaded on the TPU and handed to ``pipeline()`` silently runs on the CPU.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from transformers import AutoModelForCausalLM, pipeline  # noqa: E402

import transformers_tpu_ext as ext  # noqa: E402
from transformers_tpu_ext.testing import tiny  # noqa: E402

GREEDY = dict(max_new_tokens=6, do_sample=False)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = str(tiny.save_tiny_model(tmp_path_factory.mktemp("qwen3"), arch="qwen3"))
    tiny.check_context_sensitive(AutoModelForCausalLM.from_pretrained(path))
    return path


@pytest.fixture
def tpu(simulated_tpu):
    import transformers.pipelines.base  # noqa: F401 - the patch's target

    ext.activate()
    assert "transformers_pipeline" in ext.active_patches()
    return simulated_tpu


def _cpu_text(model_dir: str, prompt: str) -> str:
    cpu = pipeline("text-generation", model=model_dir, device="cpu")
    return cpu(prompt, **GREEDY)[0]["generated_text"]


@pytest.mark.slow
def test_a_tpu_model_handed_to_pipeline_stays_on_the_tpu(tpu, model_dir):
    model = AutoModelForCausalLM.from_pretrained(model_dir, device_map="auto")
    assert model.device.type == "tpu"
    pipe = pipeline("text-generation", model=model, tokenizer=tiny.tiny_tokenizer())
    assert pipe.device.type == "tpu" and pipe.model.device.type == "tpu"
    before = tpu.counters()
    text = pipe(tiny.TINY_TEXT[0], **GREEDY)[0]["generated_text"]
    assert (tpu.counters() - before).programs > 0, "nothing ran on the TPU"
    assert text == _cpu_text(model_dir, tiny.TINY_TEXT[0])


def test_an_integer_device_means_the_chip(tpu, model_dir):
    pipe = pipeline("text-generation", model=model_dir, device=0)
    assert pipe.device.type == "tpu" and pipe.model.device.type == "tpu"


def test_without_the_patch_the_model_moves_to_the_cpu(tpu, model_dir, monkeypatch):
    # What the patch fixes, shown on the same code: upstream turns "no device" into the CPU.
    monkeypatch.setenv("TRANSFORMERS_TPU_EXT_DISABLE", "transformers_pipeline")
    ext.deactivate()
    ext.activate()
    try:
        model = AutoModelForCausalLM.from_pretrained(model_dir, device_map="auto")
        pipe = pipeline("text-generation", model=model, tokenizer=tiny.tiny_tokenizer())
        assert pipe.model.device.type == "cpu"
    finally:
        monkeypatch.delenv("TRANSFORMERS_TPU_EXT_DISABLE")
        ext.deactivate()
        ext.activate()


def test_without_a_tpu_pipelines_are_upstreams(tpu, model_dir):
    with tpu.hidden():
        model = AutoModelForCausalLM.from_pretrained(model_dir)
        pipe = pipeline("text-generation", model=model, tokenizer=tiny.tiny_tokenizer(), device=0)
        assert pipe.device.type == "cpu"  # upstream's answer on a host without an accelerator
