"""Saving, loading and resuming on device memory as a chip shows it (issue 19, item 12).

A torch_tpu tensor's storage is on the chip and its data pointer is an opaque handle that changes
with every in-place write (``shared/reference/torch_tpu-0.2.0-internals.md`` Q1); the simulated TPU
shows the same (``tests/simulator/test_simulated_storage.py``). Every save path a user takes runs
here on such storage: ``Trainer.save_model``, checkpoints and ``resume_from_checkpoint``,
``Accelerator.save_state``/``load_state``, PEFT ``save_pretrained``, safetensors' shared-tensor
check. Each test first asserts that it runs on chip-like storage (what the simulator did not offer
before), then that what it saved loads back equal. And the plugin's own checkpoint files: the
sequence buckets already used are saved apart from the TPU random state, so a failure to save one
does not lose the other.
"""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import _training  # noqa: E402
from _training import losses, max_diff, requires_trainer, trainer  # noqa: E402

from transformers_tpu_ext.testing.tiny import tiny_lm_dataset, tiny_model  # noqa: E402


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
    _training.reset_accelerate()


def assert_chip_like_storage(tensor: torch.Tensor) -> None:
    """What user code sees of a tpu tensor's memory is what torch_tpu shows: a storage on ``tpu``
    whose data pointer is a handle that changes with every in-place write."""
    assert tensor.device.type == "tpu"
    storage = tensor.untyped_storage()
    assert storage.device.type == "tpu", f"the storage user code gets is on {storage.device}, not the chip"
    before = tensor.data_ptr()
    assert before == storage.data_ptr() + tensor.storage_offset() * tensor.element_size()
    with torch.no_grad():
        tensor.add_(0)
    assert tensor.data_ptr() != before, "the data pointer did not change after an in-place write"


def _host_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}


def _equal_states(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k].cpu(), b[k].cpu()) for k in a)


@requires_trainer
def test_trainer_save_model_after_training_reloads_equal_and_tied(simulated_tpu, tmp_path):
    from transformers import AutoModelForCausalLM

    run = trainer(str(tmp_path / "run"), use_cpu=False, max_steps=3)
    run.train()
    assert_chip_like_storage(run.model.model.norm.weight)
    run.save_model(str(tmp_path / "saved"))
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "saved")
    assert _equal_states(_host_state(loaded), _host_state(run.model))
    assert loaded.lm_head.weight is loaded.model.embed_tokens.weight


@pytest.mark.slow
@requires_trainer
def test_checkpoints_save_and_resume_on_chip_like_storage(simulated_tpu, tmp_path):
    simulated_tpu.configure(untie_on_move=True)
    common = dict(use_cpu=False, max_steps=6, save_strategy="steps", save_steps=3)
    full = trainer(str(tmp_path / "full"), model=tiny_model("qwen3", seed=0, attention_dropout=0.2), **common)
    full.train()
    assert_chip_like_storage(full.model.model.norm.weight)
    optimizer_state = torch.load(tmp_path / "full" / "checkpoint-3" / "optimizer.pt", weights_only=True)
    assert any(
        isinstance(v, torch.Tensor) and v.device.type == "tpu"
        for state in optimizer_state["state"].values() for v in state.values()
    )
    resumed = trainer(str(tmp_path / "resumed"), model=tiny_model("qwen3", seed=1, attention_dropout=0.2), **common)
    resumed.train(resume_from_checkpoint=str(tmp_path / "full" / "checkpoint-3"))
    assert max_diff(losses(resumed)[3:], losses(full)[3:]) < 1e-5
    assert _equal_states(_host_state(resumed.model), _host_state(full.model))


def test_accelerator_save_state_and_load_state_on_chip_like_storage(simulated_tpu, tmp_path):
    from accelerate import Accelerator

    accelerator = Accelerator()
    model = tiny_model("qwen3", seed=0)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loader = torch.utils.data.DataLoader(
        [{"input_ids": r["input_ids"][:16]} for r in tiny_lm_dataset(8, min_length=16, seed=2)],
        batch_size=4, collate_fn=_training.collator(),
    )
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for batch in loader:
        accelerator.backward(model(**batch).loss)
        optimizer.step()
        optimizer.zero_grad()
    assert_chip_like_storage(model.model.norm.weight)
    saved_model, saved_optimizer = _host_state(model), optimizer.state_dict()
    accelerator.save_state(str(tmp_path / "state"))
    with torch.no_grad():
        for param in model.parameters():
            param.zero_()
    accelerator.load_state(str(tmp_path / "state"))
    assert _equal_states(_host_state(model), saved_model)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    restored = optimizer.state_dict()["state"]
    for key, state in saved_optimizer["state"].items():
        assert all(torch.equal(state[k].cpu(), restored[key][k].cpu()) for k in state)


def test_peft_save_pretrained_on_chip_like_storage(simulated_tpu, tmp_path):
    peft = pytest.importorskip("peft")

    model = peft.get_peft_model(tiny_model("qwen3", seed=0), peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    model.to("tpu")
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.5)
    ids = torch.tensor([tiny_lm_dataset(1, min_length=16, max_length=16, seed=4)[0]["input_ids"]], device="tpu")
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    lora = {k: v for k, v in model.named_parameters() if "lora_" in k}
    assert_chip_like_storage(next(iter(lora.values())))
    model.save_pretrained(tmp_path / "adapter")
    reloaded = peft.PeftModel.from_pretrained(tiny_model("qwen3", seed=0), tmp_path / "adapter")
    again = {k: v for k, v in reloaded.named_parameters() if "lora_" in k}
    assert lora.keys() == again.keys()
    assert all(torch.equal(lora[k].detach().cpu(), again[k].detach().cpu()) for k in lora)
    # the update is in the adapter: a LoRA B matrix starts at zero and is no longer
    assert any(k.endswith("lora_B.default.weight") and again[k].abs().sum() > 0 for k in again)


def test_safetensors_shared_tensor_check_on_chip_like_storage(simulated_tpu, tmp_path):
    from safetensors.torch import load_model, save_file, save_model

    model = tiny_model("qwen3", seed=0).to("tpu")  # tied embeddings
    weight = model.lm_head.weight
    assert weight is model.model.embed_tokens.weight
    assert_chip_like_storage(weight)
    with pytest.raises(RuntimeError, match="share memory"):  # two names, one memory: refused
        save_file({"a": weight, "b": weight}, tmp_path / "shared.safetensors")
    save_file({"a": weight, "b": weight[:2].clone()}, tmp_path / "distinct.safetensors")
    save_model(model, str(tmp_path / "model.safetensors"))  # drops the tied duplicate
    fresh = tiny_model("qwen3", seed=1)
    load_model(fresh, str(tmp_path / "model.safetensors"))
    assert _equal_states(_host_state(fresh), _host_state(model))


# -- the plugin's own checkpoint files ----------------------------------------------------------------

#: Batches of 90, 60, 90 tokens: rung 96; then 64, never used, so 96 is reused (<= 1.5 x 64). A run
#: that forgot the rungs already used pads the second batch to 64 instead.
_LENGTHS = (90,) * 4 + (60,) * 4 + (90,) * 4
_COMMON = dict(use_cpu=False, max_steps=3, per_device_train_batch_size=4, save_strategy="steps", save_steps=1,
               train_sampling_strategy="sequential")


def _lengths_seen(run) -> list[int]:
    seen: list[int] = []
    run.model.register_forward_pre_hook(lambda module, args, kwargs: seen.append(kwargs["input_ids"].shape[1]), with_kwargs=True)
    return seen


@requires_trainer
def test_bucket_history_survives_a_checkpoint_whose_tpu_random_state_cannot_be_saved(simulated_tpu, tmp_path, monkeypatch):
    """A resumed run pads its batches as the interrupted run did (a rung's reuse depends on the rungs
    already used), even when the TPU's random state could not be read for the checkpoint."""
    data = [{"input_ids": list(range(2, 2 + n))} for n in _LENGTHS]
    full = trainer(str(tmp_path / "full"), data=data, **_COMMON)
    full_lengths = _lengths_seen(full)
    broken = type("Broken", (), {"get_state": lambda self: (_ for _ in ()).throw(RuntimeError("unreadable")),
                                 "set_state": lambda self, state: None})()
    monkeypatch.setattr(torch.tpu, "default_generators", (broken,))
    full.train()
    monkeypatch.undo()
    checkpoint = tmp_path / "full" / "checkpoint-1"
    assert not (checkpoint / "tpu_state.pth").exists()  # the random state was not saved
    resumed = trainer(str(tmp_path / "resumed"), data=data, **_COMMON)
    resumed_lengths = _lengths_seen(resumed)
    resumed.train(resume_from_checkpoint=str(checkpoint))
    assert full_lengths == [96, 96, 96] and resumed_lengths == full_lengths[1:]


@requires_trainer
def test_checkpoint_files_load_without_torch_tpu(simulated_tpu, tmp_path):
    """The bucket history is plain JSON and the TPU random state a host tensor: a host without
    torch_tpu reads both (``weights_only=True``, ``map_location`` not needed)."""
    data = [{"input_ids": list(range(2, 2 + n))} for n in _LENGTHS]
    trainer(str(tmp_path / "run"), data=data, **{**_COMMON, "max_steps": 1}).train()
    checkpoint = tmp_path / "run" / "checkpoint-1"
    assert json.loads((checkpoint / "tpu_buckets.json").read_text()) == {"bucket_lengths": [96]}
    state = torch.load(checkpoint / "tpu_state.pth", weights_only=True)
    assert set(state) == {"tpu"} and state["tpu"].device.type == "cpu"
