"""``device_map="auto"`` finds the (simulated) TPU: from_pretrained, pipeline, budgets, tied weights."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from transformers import AutoModelForCausalLM, pipeline  # noqa: E402

from transformers_tpu_ext import activation, config  # noqa: E402
from transformers_tpu_ext.placement.budget import HEADROOM_ENV  # noqa: E402
from transformers_tpu_ext.testing import tiny  # noqa: E402

from _subprocess import run_python  # noqa: E402

PLACEMENT = ("accelerate_memory", "transformers_device_map")
GREEDY = dict(max_new_tokens=6, do_sample=False)


@contextlib.contextmanager
def patches_disabled(*names: str) -> Iterator[None]:
    """Run the block with some patches switched off (``TRANSFORMERS_TPU_EXT_DISABLE``), in-process."""
    before = os.environ.get(config.DISABLE_ENV)
    os.environ[config.DISABLE_ENV] = ",".join(names)
    activation.deactivate()
    activation.activate()
    try:
        assert not set(names) & set(activation.active_patches())
        yield
    finally:
        if before is None:
            os.environ.pop(config.DISABLE_ENV, None)
        else:
            os.environ[config.DISABLE_ENV] = before
        activation.deactivate()
        activation.activate()


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tiny.save_tiny_model(tmp_path_factory.mktemp("qwen3"), arch="qwen3"))


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tiny.save_tiny_model(tmp_path_factory.mktemp("llama"), arch="llama"))


@pytest.fixture(scope="module")
def prompt() -> Any:
    return tiny.tiny_tokenizer()(tiny.TINY_TEXT[0], return_tensors="pt").input_ids


def _devices(model: Any) -> set[str]:
    return {p.device.type for p in model.parameters()}


def test_auto_device_map_loads_on_tpu(simulated_tpu, qwen3_dir, prompt) -> None:
    model = AutoModelForCausalLM.from_pretrained(qwen3_dir, device_map="auto")
    assert model.device.type == "tpu"
    assert _devices(model) == {"tpu"}
    reference = AutoModelForCausalLM.from_pretrained(qwen3_dir)
    out = model.generate(prompt.to(model.device), **GREEDY)
    assert out.cpu().tolist() == reference.generate(prompt, **GREEDY).tolist()


def test_without_the_patches_auto_loads_on_cpu(simulated_tpu, qwen3_dir) -> None:
    # The defect this fixes, reproduced on the simulated TPU (Accelerate 1.15 lists no TPU).
    with patches_disabled(*PLACEMENT):
        model = AutoModelForCausalLM.from_pretrained(qwen3_dir, device_map="auto")
    assert model.device.type == "cpu"


def test_integer_device_map_means_the_chip(simulated_tpu, llama_dir) -> None:
    model = AutoModelForCausalLM.from_pretrained(llama_dir, device_map={"model": 0, "lm_head": "cpu"})
    # Upstream's convention: the accelerator's index, so f"{device_type}:{index}" names the chip.
    assert model.hf_device_map == {"model": 0, "lm_head": "cpu"}
    assert model.model.embed_tokens.weight.device.type == "tpu"
    index = model.hf_device_map["model"]
    assert torch.device(f"tpu:{index}") == model.model.embed_tokens.weight.device


def test_pipeline_reads_integer_devices_as_the_chip(simulated_tpu, llama_dir) -> None:
    split = AutoModelForCausalLM.from_pretrained(llama_dir, device_map={"model": 0, "lm_head": "cpu"})
    assert pipeline("text-generation", model=split, tokenizer=llama_dir).device == torch.device("tpu:0")
    for device in ({"device": 0}, {}):  # upstream's default device is 0, the accelerator
        pipe = pipeline("text-generation", model=llama_dir, **device)
        assert pipe.device == torch.device("tpu:0") and pipe.model.device.type == "tpu"
    assert pipeline("text-generation", model=llama_dir, device=-1).device.type == "cpu"
    with simulated_tpu.hidden():  # no TPU: upstream's choice (the CPU here)
        assert pipeline("text-generation", model=llama_dir).device.type == "cpu"


@pytest.mark.slow
def test_pipeline_device_map_auto_generates_on_tpu(simulated_tpu, qwen3_dir) -> None:
    pipe = pipeline("text-generation", model=qwen3_dir, device_map="auto")
    assert pipe.model.device.type == "tpu"
    assert pipe.device.type == "tpu"
    text = pipe(tiny.TINY_TEXT[0], **GREEDY)[0]["generated_text"]
    cpu = pipeline("text-generation", model=qwen3_dir, device="cpu")
    assert text == cpu(tiny.TINY_TEXT[0], **GREEDY)[0]["generated_text"]
    assert len(text) > len(tiny.TINY_TEXT[0])


@pytest.mark.slow
def test_pipeline_device_tpu(simulated_tpu, qwen3_dir) -> None:
    pipe = pipeline("text-generation", model=qwen3_dir, device="tpu")
    assert pipe.model.device.type == "tpu"
    assert len(pipe(tiny.TINY_TEXT[1], **GREEDY)[0]["generated_text"]) > len(tiny.TINY_TEXT[1])


def test_get_max_memory_lists_the_chip_with_its_budget(simulated_tpu) -> None:
    from accelerate.utils import get_max_memory

    simulated_tpu.configure(hbm_bytes="16GiB")
    memory = get_max_memory()
    assert list(memory)[:2] == ["tpu", "cpu"]
    assert memory["tpu"] == 16 * 2**30 - int(1.6 * 2**30) - 1  # 10 % headroom, rounded up
    with simulated_tpu.hidden():
        assert "tpu" not in get_max_memory()


# HBM sizes that fit the embeddings (and, for the tied model, lm_head with them) but not the rest.
MIXED_HBM = {"llama": "256KiB", "qwen3": "160KiB"}


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_tiny_hbm_gives_a_mixed_map(simulated_tpu, arch, request, prompt) -> None:
    path = request.getfixturevalue(f"{arch}_dir")
    simulated_tpu.configure(hbm_bytes=MIXED_HBM[arch])  # budget: half of it, less than the model
    model = AutoModelForCausalLM.from_pretrained(path, device_map="auto")
    assert set(model.hf_device_map.values()) == {0, "cpu"}
    assert model.hf_device_map["model.embed_tokens"] == 0
    assert model.device.type == "tpu"
    if arch == "qwen3":  # tied: the group is placed together, and stays one parameter
        assert model.hf_device_map["lm_head"] == 0
        assert model.lm_head.weight is model.model.embed_tokens.weight
    reference = AutoModelForCausalLM.from_pretrained(path)
    out = model.generate(prompt.to(model.device), **GREEDY)
    assert out.device.type == "tpu"
    assert out.cpu().tolist() == reference.generate(prompt, **GREEDY).tolist()


# max_memory that leaves modules for the disk (llama: tpu + cpu + disk; qwen3: tpu + disk).
DISK_MEMORY = {
    "llama": ({"tpu": "100KiB", "cpu": "90KiB"}, {0, "cpu", "disk"}),
    "qwen3": ({"tpu": "100KiB", "cpu": "20KiB"}, {0, "disk"}),
}


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_disk_offload_generates_the_cpu_tokens(simulated_tpu, arch, request, prompt, tmp_path) -> None:
    path = request.getfixturevalue(f"{arch}_dir")
    max_memory, devices = DISK_MEMORY[arch]

    def load() -> Any:
        return AutoModelForCausalLM.from_pretrained(
            path, device_map="auto", max_memory=dict(max_memory), offload_folder=str(tmp_path)
        )

    model = load()
    assert set(model.hf_device_map.values()) == devices
    reference = AutoModelForCausalLM.from_pretrained(path)
    out = model.generate(prompt.to(model.device), **GREEDY)
    assert out.cpu().tolist() == reference.generate(prompt, **GREEDY).tolist()
    if arch == "llama":
        # Upstream, Accelerate reads disk weights with safetensors.safe_open(..., device="tpu"),
        # which safetensors rejects: the first forward of a disk module fails.
        with patches_disabled("accelerate_offload"):
            upstream = load()
            with pytest.raises(Exception, match="device tpu is invalid"):
                upstream.generate(prompt.to("tpu"), **GREEDY)


def test_tiny_hbm_without_the_patches_is_all_cpu(simulated_tpu, llama_dir) -> None:
    simulated_tpu.configure(hbm_bytes="256KiB")
    with patches_disabled(*PLACEMENT):
        model = AutoModelForCausalLM.from_pretrained(llama_dir, device_map="auto")
    assert not hasattr(model, "hf_device_map")
    assert _devices(model) == {"cpu"}


def test_user_max_memory_wins(simulated_tpu, llama_dir) -> None:
    # The chip is large (GiBs), but the user allows 128 KiB on it: mixed map.
    model = AutoModelForCausalLM.from_pretrained(
        llama_dir, device_map="auto", max_memory={"tpu": "128KiB", "cpu": "1GiB"}
    )
    assert set(model.hf_device_map.values()) == {0, "cpu"}
    # The GPU habit (0 = the first accelerator) names the chip too.
    model = AutoModelForCausalLM.from_pretrained(llama_dir, device_map="auto", max_memory={0: "128KiB", "cpu": "1GiB"})
    assert set(model.hf_device_map.values()) == {0, "cpu"}
    # A max_memory without the chip keeps the model off it, as it does for a GPU.
    model = AutoModelForCausalLM.from_pretrained(llama_dir, device_map="auto", max_memory={"cpu": "1GiB"})
    assert _devices(model) == {"cpu"}


def test_headroom_env_override(simulated_tpu, llama_dir, monkeypatch) -> None:
    simulated_tpu.configure(hbm_bytes="256KiB")
    monkeypatch.setenv(HEADROOM_ENV, "0")  # the whole 256 KiB: the model fits
    model = AutoModelForCausalLM.from_pretrained(llama_dir, device_map="auto")
    assert _devices(model) == {"tpu"}


def test_nothing_on_the_chip_is_never_silent(simulated_tpu, llama_dir, caplog) -> None:
    simulated_tpu.configure(hbm_bytes="64KiB")  # budget 32 KiB: not even the embeddings fit
    with caplog.at_level(logging.WARNING, logger="transformers_tpu_ext"):
        model = AutoModelForCausalLM.from_pretrained(llama_dir, device_map="auto")
    assert _devices(model) == {"cpu"}
    assert "placed no module on the TPU" in caplog.text


def test_no_tpu_is_upstream(simulated_tpu, qwen3_dir, prompt) -> None:
    with simulated_tpu.hidden():
        from accelerate.utils import get_max_memory

        model = AutoModelForCausalLM.from_pretrained(qwen3_dir, device_map="auto")
        assert "tpu" not in get_max_memory()
        tokens = model.generate(prompt, **GREEDY).tolist()
        with patches_disabled("all"):
            upstream = AutoModelForCausalLM.from_pretrained(qwen3_dir, device_map="auto")
            assert upstream.generate(prompt, **GREEDY).tolist() == tokens
    assert _devices(model) == _devices(upstream) == {"cpu"}


def _tied(model: Any) -> bool:
    return model.lm_head.weight is model.model.embed_tokens.weight


@pytest.mark.parametrize("move", ["to", "tpu", "pipeline", "back_to_cpu"])
def test_tied_weights_stay_tied(simulated_tpu, qwen3_dir, move) -> None:
    simulated_tpu.configure(untie_on_move=True)  # torch_tpu #4161, inside Module._apply

    def moved():
        if move == "pipeline":
            return pipeline("text-generation", model=qwen3_dir, device="tpu").model
        model = AutoModelForCausalLM.from_pretrained(qwen3_dir)
        if move == "to":
            return model.to("tpu")
        if move == "tpu":
            return model.tpu()
        return model.to("tpu").cpu()

    model = moved()
    assert model.device.type == ("cpu" if move == "back_to_cpu" else "tpu")
    assert _tied(model)
    assert len(list(model.parameters())) == len({id(p) for p in model.parameters()})
    with torch.no_grad():  # one matrix: an update of the embeddings reaches the output layer
        model.model.embed_tokens.weight[0].fill_(0.5)
    assert model.lm_head.weight[0].cpu().tolist() == [0.5] * model.config.hidden_size
    with patches_disabled("transformers_tied_weights"):
        untied = moved()
    assert not _tied(untied)  # the quirk is real


@pytest.mark.slow
def test_tied_weights_stay_tied_when_the_tpu_appears_after_transformers() -> None:
    # The patch decides "is there a TPU?" when a model moves, not when Transformers is imported:
    # here the TPU is registered (Module.tpu() appears) after the patch was applied.
    value, _ = run_python(
        """
import os, warnings
warnings.simplefilter("ignore")
import torch
import transformers.modeling_utils
import transformers_tpu_ext as ext
from transformers_tpu_ext import backend, testing
from transformers_tpu_ext.testing.tiny import tiny_model
applied = "transformers_tied_weights" in ext.active_patches()
had_tpu = backend.tpu_available() or hasattr(torch.nn.Module, "tpu")
testing.install(untie_on_move=True)
def tied(model):
    return model.lm_head.weight is model.model.embed_tokens.weight
moved = tiny_model("qwen3").tpu()
result = [applied, had_tpu, moved.device.type, tied(moved)]
os.environ["TRANSFORMERS_TPU_EXT_DISABLE"] = "transformers_tied_weights"
ext.deactivate(); ext.activate()
result.append(tied(tiny_model("qwen3").tpu()))
report(result)
"""
    )
    assert value == [True, False, "tpu", True, False]


def test_deactivate_restores_every_patched_name() -> None:
    import accelerate.utils
    import accelerate.utils.modeling as modeling
    import accelerate.utils.offload as offload
    import safetensors
    import transformers.integrations.accelerate as integration
    import transformers.modeling_utils as modeling_utils
    import wrapt

    def names():
        return [
            modeling.get_max_memory,
            accelerate.utils.get_max_memory,
            integration.accelerate_max_memory,
            integration.get_max_memory,
            modeling_utils._get_device_map,
            modeling_utils.PreTrainedModel.__dict__.get("_apply"),
            offload.safe_open,
        ]

    patched = names()
    assert all(hasattr(obj, "__wrapped__") for obj in patched)
    activation.deactivate()
    try:
        originals = names()
        assert not any(isinstance(obj, wrapt.FunctionWrapper) for obj in originals)
        assert originals[0] is originals[1] is originals[2]
        assert originals[5] is None  # PreTrainedModel inherits Module._apply again
        assert originals[6] is safetensors.safe_open
    finally:
        activation.activate()
    assert names() == patched
