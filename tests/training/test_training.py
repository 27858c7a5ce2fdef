"""Training on one (simulated) TPU chip: plain Trainer and Accelerate code, compared with the CPU.

Patches ``accelerate_state``, ``accelerate_dataclasses``, ``accelerate_prepare``, ``torch_ddp``,
``transformers_training_args``, ``transformers_trainer``; policy in ``batch_buckets`` and
``training_policy``. Every run uses the tiny context-sensitive Qwen3 and sequences of 8..120 tokens.
"""

from __future__ import annotations

import logging
import os

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import _training  # noqa: E402
from _training import (  # noqa: E402
    STEPS, losses, max_diff, patches_disabled, requires_trainer, step_counter, trainer,
)

from transformers_tpu_ext.training import buckets as batch_buckets
from transformers_tpu_ext import testing  # noqa: E402
from transformers_tpu_ext.testing.tiny import check_context_sensitive, tiny_lm_dataset, tiny_model  # noqa: E402
from transformers_tpu_ext.training.collator import BucketCollator  # noqa: E402
from transformers_tpu_ext.training.warm_up import warmup  # noqa: E402

from _subprocess import run_python  # noqa: E402

TOLERANCE = 1e-3
TRAINING_PATCHES = (
    "accelerate_state", "accelerate_dataclasses", "accelerate_prepare", "torch_ddp",
    "transformers_training_args", "transformers_trainer",
)


@pytest.fixture(scope="module")
def cpu_reference(tmp_path_factory) -> list[float]:
    """Per-step losses of the 24-step Trainer run on the CPU (the plugin changes nothing there)."""
    testing.install()
    torch.set_num_threads(1)
    model = tiny_model("qwen3", seed=0)
    check_context_sensitive(model)
    run = trainer(str(tmp_path_factory.mktemp("cpu")), use_cpu=True, model=model)
    run.train()
    return losses(run)


def _on_tpu(run) -> bool:
    return all(p.device.type == "tpu" for p in run.model.parameters())


# -- one chip: Trainer and Accelerate pick the TPU -----------------------------------------------


@requires_trainer
def test_trainer_trains_on_tpu_like_cpu_with_programs_bounded_by_buckets(simulated_tpu, cpu_reference, tmp_path):
    counter = step_counter(simulated_tpu)
    run = trainer(str(tmp_path), use_cpu=False, callbacks=[counter])
    assert run.args.device.type == "tpu" and run.accelerator.device.type == "tpu"
    run.train()
    assert _on_tpu(run)
    assert max_diff(losses(run), cpu_reference) < TOLERANCE
    programs = [c.programs for c in counter.steps]
    first, second = sum(programs[: STEPS // 2]), sum(programs[STEPS // 2 :])
    assert first > 0 and second <= 0.1 * first, programs
    lengths = run.__dict__["_tpu_ext_bucket_lengths"]
    assert lengths and lengths <= {16, 32, 48, 64, 96, 128}


@requires_trainer
def test_warmup_compiles_every_bucket_before_the_first_step(simulated_tpu, cpu_reference, tmp_path):
    import contextlib

    from transformers import TrainerCallback

    after_warmup = contextlib.ExitStack()

    class SinceTheFirstStep(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            if state.global_step == 0:  # after the warmup, which runs when training begins
                self.before = simulated_tpu.counters()
                # The proof torch_tpu gives: in cache-only mode any program the warm-up missed (a graph
                # or an eager operation) is an error.
                after_warmup.enter_context(testing.cache_only("training after its warm-up"))

    counter, since = step_counter(simulated_tpu), SinceTheFirstStep()
    run = trainer(str(tmp_path), use_cpu=False, callbacks=[counter, since])
    warmed = warmup(run, max_length=120)
    with after_warmup:
        run.train()
    assert warmed.lengths == [16, 32, 48, 64, 96, 128]
    assert [c.programs for c in counter.steps] == [0] * STEPS
    # nor between the steps: logging the loss (gathered, averaged, zeroed: logging_steps=1) compiles nothing
    assert (simulated_tpu.counters() - since.before).programs == 0
    # the warmup's steps left no trace: same losses as the CPU run without any warmup
    assert max_diff(losses(run), cpu_reference) < TOLERANCE


@requires_trainer
def test_without_the_patches_the_trainer_trains_on_tpu_only_with_accelerate_1_16(simulated_tpu, tmp_path):
    """Accelerate up to 1.15 has no TPU in its device selection: without the patches the Trainer puts
    the model on the TPU and Accelerate its batches on the CPU. Accelerate 1.16 picks
    ``torch.accelerator``'s device itself: the patches then leave the device to it."""
    with patches_disabled(*TRAINING_PATCHES):
        run = trainer(str(tmp_path), use_cpu=False, max_steps=1)
        assert run.args.device.type == "tpu"
        if _training.accelerate_finds_the_tpu():  # docs/training.md: "Accelerate 1.16: trains on the chip"
            assert run.accelerator.device.type == "tpu"
            run.train()
            assert next(run.model.parameters()).device.type == "tpu"
            assert run.state.log_history[-1]["train_loss"] > 0
            return
        assert run.accelerator.device.type == "cpu"
        with pytest.raises(RuntimeError, match="expected to be on tpu, got cpu"):
            run.train()


def test_plain_accelerate_loop_trains_on_tpu_like_cpu(simulated_tpu):
    from accelerate import Accelerator
    from transformers import get_linear_schedule_with_warmup

    def loop(cpu: bool) -> tuple[list[float], str, str]:
        _training.reset_accelerate()
        accelerator = Accelerator(cpu=cpu)
        model = tiny_model("qwen3", seed=0).train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        schedule = get_linear_schedule_with_warmup(optimizer, 0, 6)
        loader = torch.utils.data.DataLoader(tiny_lm_dataset(24), batch_size=4, collate_fn=_training.collator())
        model, optimizer, loader, schedule = accelerator.prepare(model, optimizer, loader, schedule)
        seen = []
        for batch in loader:
            loss = model(**batch).loss
            accelerator.backward(loss)
            optimizer.step()
            schedule.step()
            optimizer.zero_grad()
            seen.append(loss.item())
        return seen, str(accelerator.device), str(next(model.parameters()).device)

    cpu_losses, _, _ = loop(cpu=True)
    tpu_losses, device, param_device = loop(cpu=False)
    # Accelerate 1.16 names torch.accelerator's device without its index (`tpu`), as it names `cuda`
    assert device == ("tpu" if _training.accelerate_finds_the_tpu() else "tpu:0") and param_device == "tpu:0"
    assert max_diff(tpu_losses, cpu_losses) < TOLERANCE


@requires_trainer
def test_partial_last_batch_is_completed_with_ignored_rows(simulated_tpu, tmp_path):
    data = tiny_lm_dataset(10)  # batches of 4, 4 and 2
    cpu = trainer(str(tmp_path / "cpu"), use_cpu=True, data=data, max_steps=-1, num_train_epochs=1)
    cpu.train()
    tpu = trainer(str(tmp_path / "tpu"), use_cpu=False, data=data, max_steps=-1, num_train_epochs=1)
    shapes = [tuple(batch["input_ids"].shape) for batch in tpu.get_train_dataloader()]
    assert [rows for rows, _ in shapes] == [4, 4, 4] and {n for _, n in shapes} <= set(batch_buckets.sequence_ladder())
    tpu.train()
    assert len(losses(tpu)) == 3 and max_diff(losses(tpu), losses(cpu)) < TOLERANCE


def test_bucket_collator_pads_right_and_ignores_padding():
    def collate(features):
        return {
            "input_ids": torch.tensor([[5, 6, 7], [8, 9, 0]]),
            "attention_mask": torch.tensor([[1, 1, 1], [1, 1, 0]]),
            "labels": torch.tensor([[5, 6, 7], [8, 9, -100]]),
        }

    batch = BucketCollator(collate, batch_size=4, pad_token_id=0)(None)
    assert batch["input_ids"].shape == (4, 16)
    assert batch["input_ids"][0, :3].tolist() == [5, 6, 7] and batch["input_ids"][0, 3:].eq(0).all()
    assert batch["attention_mask"][:2, 3:].eq(0).all()
    assert batch["labels"][:2, 3:].eq(-100).all() and batch["labels"][2:].eq(-100).all()
    assert torch.equal(batch["input_ids"][2], batch["input_ids"][0])  # dummy rows copy a real row
    off = BucketCollator(collate, batch_size=4, settings=batch_buckets.Settings(enabled=False))(None)
    assert off["input_ids"].shape == (2, 3)


# -- compile and the optimizer -------------------------------------------------------------------


@pytest.mark.slow
@requires_trainer
def test_torch_compile_uses_the_tpu_backend_and_compiles_once(simulated_tpu, cpu_reference, tmp_path, caplog):
    counter = step_counter(simulated_tpu)
    run = trainer(str(tmp_path), use_cpu=False, callbacks=[counter], torch_compile=True, optim="adamw_torch")
    assert run.args.torch_compile_backend == "tpu"
    run.train()
    graphs = [c.graphs_compiled for c in counter.steps]
    buckets = run.__dict__["_tpu_ext_bucket_lengths"]
    # one graph of the model per sequence bucket, one of the optimizer step for the whole run
    assert graphs[0] == 2 and sum(graphs) == len(buckets) + 1, (graphs, buckets)
    assert max_diff(losses(run), cpu_reference) < TOLERANCE
    with caplog.at_level(logging.WARNING, logger="transformers_tpu_ext"):
        adapted = trainer(str(tmp_path), use_cpu=False, torch_compile_backend="inductor", torch_compile_mode="max-autotune")
    assert (adapted.args.torch_compile_backend, adapted.args.torch_compile_mode) == ("tpu", None)
    assert "inductor" in caplog.text


def test_schedule_and_step_count_do_not_recompile_the_optimizer(simulated_tpu):
    from accelerate import Accelerator

    def graphs_per_step(accelerator_or_none) -> list[int]:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2)).to("tpu")
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=True)
        schedule = torch.optim.lr_scheduler.LinearLR(optimizer, 1.0, 0.1, total_iters=10)
        if accelerator_or_none is not None:
            model, optimizer, schedule = accelerator_or_none.prepare(model, optimizer, schedule)
        else:
            optimizer.step = torch.compile(optimizer.step, backend="tpu", dynamic=False)
        x, seen = torch.ones(4, 8, device="tpu"), []
        for _ in range(5):
            before = simulated_tpu.counters()
            model(x).sum().backward()
            optimizer.step()
            schedule.step()
            optimizer.zero_grad()
            seen.append((simulated_tpu.counters() - before).graphs_compiled)
        return seen

    # What the plugin avoids: a float learning rate changes every step and recompiles the step.
    assert graphs_per_step(None) == [1] * 5
    _training.reset_accelerate()
    accelerator = Accelerator(dynamo_backend="tpu")
    assert graphs_per_step(accelerator) == [2, 0, 0, 0, 0]  # model + optimizer step, once
    inner = accelerator._optimizers[0].optimizer
    # the tensor learning rate exists only during step(): what the user reads is what they made
    assert type(inner.param_groups[0]["lr"]) is float and inner.param_groups[0]["capturable"] is False
    assert inner.param_groups[0]["foreach"] is True and not inner.defaults["capturable"]


# -- state: checkpoints, accumulation, checkpointing, bf16, evaluation ----------------------------


@requires_trainer
def test_checkpoint_resume_continues_the_run(simulated_tpu, tmp_path):
    simulated_tpu.configure(untie_on_move=True)  # torch_tpu #4161: moves untie weights
    dropout = dict(attention_dropout=0.2)  # random numbers on the TPU matter for the losses
    common = dict(use_cpu=False, max_steps=8, save_strategy="steps", save_steps=4)
    full = trainer(str(tmp_path / "full"), model=tiny_model("qwen3", seed=0, **dropout), **common)
    full.train()
    checkpoint = tmp_path / "full" / "checkpoint-4"
    assert (checkpoint / "tpu_state.pth").is_file()
    resumed = trainer(str(tmp_path / "resumed"), model=tiny_model("qwen3", seed=1, **dropout), **common)
    resumed.train(resume_from_checkpoint=str(checkpoint))
    assert max_diff(losses(resumed)[4:], losses(full)[4:]) < 1e-5
    model = resumed.model
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert model.lm_head.weight.device.type == "tpu"


@requires_trainer
def test_gradient_accumulation_and_checkpointing_match_cpu(simulated_tpu, tmp_path):
    settings = dict(max_steps=4, gradient_accumulation_steps=2, gradient_checkpointing=True)
    cpu = trainer(str(tmp_path / "cpu"), use_cpu=True, **settings)
    cpu.train()
    tpu = trainer(str(tmp_path / "tpu"), use_cpu=False, **settings)
    tpu.train()
    assert tpu.model.is_gradient_checkpointing and _on_tpu(tpu)
    assert max_diff(losses(tpu), losses(cpu)) < TOLERANCE


@requires_trainer
def test_bf16_mixed_precision_trains_on_tpu(simulated_tpu, tmp_path):
    cpu = trainer(str(tmp_path / "cpu"), use_cpu=True, max_steps=4, bf16=True)
    cpu.train()
    tpu = trainer(str(tmp_path / "tpu"), use_cpu=False, max_steps=4, bf16=True)
    tpu.train()
    assert tpu.accelerator.mixed_precision == "bf16" and _on_tpu(tpu)
    assert next(tpu.model.parameters()).dtype == torch.float32  # bf16 compute, fp32 master weights
    assert max_diff(losses(tpu), losses(cpu)) < 2e-2  # bf16 matmuls, padded shapes


@requires_trainer
def test_evaluation_keeps_real_rows_and_matches_cpu(simulated_tpu, tmp_path):
    evaluation = dict(max_steps=4, eval_strategy="steps", eval_steps=2)
    eval_data = tiny_lm_dataset(10, seed=5)  # a partial last batch of 2
    cpu = trainer(str(tmp_path / "cpu"), use_cpu=True, eval_data=eval_data, **evaluation)
    cpu.train()
    tpu = trainer(str(tmp_path / "tpu"), use_cpu=False, eval_data=eval_data, **evaluation)
    tpu.train()
    evals = lambda run: [e["eval_loss"] for e in run.state.log_history if "eval_loss" in e]  # noqa: E731
    assert len(evals(tpu)) == 2 and max_diff(evals(tpu), evals(cpu)) < TOLERANCE
    shapes = [tuple(b["input_ids"].shape) for b in tpu.get_eval_dataloader()]
    assert [rows for rows, _ in shapes] == [4, 4, 2]  # no dummy rows in evaluation


# -- errors a user can cause, and no TPU ----------------------------------------------------------


@pytest.mark.skipif(
    not _training._trainer_runs(),  # the same release boundary: Accelerate 1.1
    reason="Accelerate 1.1 turns WORLD_SIZE > 1 without LOCAL_RANK into a gloo run of its own (a rendezvous)",
)
def test_a_launch_without_local_rank_is_refused(simulated_tpu, monkeypatch):
    from accelerate import Accelerator

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    accelerator = Accelerator()
    with pytest.raises(RuntimeError, match="every process would train its own copy"):
        accelerator.prepare(tiny_model("qwen3"))
    with patches_disabled("accelerate_prepare"):  # what happens without the check: it just trains
        assert accelerator.prepare(tiny_model("qwen3")).device.type == "tpu"


def test_a_backend_that_cannot_reduce_tpu_tensors_is_refused(simulated_tpu, monkeypatch):
    from accelerate import PartialState

    monkeypatch.setenv("LOCAL_RANK", "0")
    with pytest.raises(ValueError, match="cannot reduce TPU tensors"):
        PartialState(backend="gloo")


def test_ddp_of_a_tpu_module_takes_no_device_ids(simulated_tpu):
    import torch.distributed as dist

    store = dist.HashStore()
    dist.init_process_group("tpu_dist", store=store, rank=0, world_size=1)
    try:
        model = torch.nn.Linear(4, 4).to("tpu")
        ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[1], output_device=1)
        assert ddp.device_ids is None and ddp.output_device is None
        ddp(torch.ones(2, 4, device="tpu")).sum().backward()
        assert model.weight.grad.device.type == "tpu"
        with patches_disabled("torch_ddp"):  # GPU-style code would point rank 1 at tpu:1
            assert torch.nn.parallel.DistributedDataParallel(model, device_ids=[1]).device_ids == [1]
    finally:
        dist.destroy_process_group()


class _SometimesUsed(torch.nn.Module):
    """``b`` is used on odd steps only, ``never`` on none: DDP needs ``find_unused_parameters=True``."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b, self.never = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, step: int) -> torch.Tensor:
        h = self.a(x)
        return (self.b(h) if step % 2 else h).sum()


def test_ddp_finds_unused_parameters_of_a_tpu_module_as_on_a_chip(simulated_tpu):
    """torch_tpu's pinned host allocator and ``tpu_dist`` all-reduce let DDP's reducer find unused
    parameters; so does the simulator (it once dropped the flag with a warning, and the second step
    failed). Gradients equal plain autograd on the CPU; an unused parameter has none."""
    import gc
    import warnings

    import torch.distributed as dist

    from transformers_tpu_ext.testing import pinned

    cpu = _SometimesUsed()
    model = _SometimesUsed().to("tpu")
    dist.init_process_group("tpu_dist", store=dist.HashStore(), rank=0, world_size=1)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            ddp = torch.nn.parallel.DistributedDataParallel(model, find_unused_parameters=True)
        assert ddp.find_unused_parameters is True
        for step in range(4):
            x = torch.randn(2, 4, generator=torch.Generator().manual_seed(step))
            ddp(x.to("tpu"), step).backward()
            cpu(x, step).backward()
            for (name, want), got in zip(cpu.named_parameters(), model.parameters()):
                if want.grad is None:
                    assert got.grad is None, f"step {step}: {name} has a gradient"
                else:
                    assert torch.allclose(got.grad.cpu(), want.grad, atol=1e-6), f"step {step}: {name}"
            cpu.zero_grad(set_to_none=True)
            model.zero_grad(set_to_none=True)
        assert pinned._PINNED_EMPTY["library"] is not None
        del ddp
        gc.collect()
        assert pinned._PINNED_EMPTY["library"] is None  # the host-buffer kernel lives with its DDP
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
@requires_trainer
def test_without_a_tpu_nothing_changes():
    """A process with no TPU at all (no simulator): the patches are applied and change nothing."""
    result, _ = run_python(
        r"""
        import sys, torch
        sys.path.insert(0, TESTS)
        torch.set_num_threads(1)
        import transformers_tpu_ext
        from accelerate import Accelerator
        from accelerate.utils import DynamoBackend
        from transformers import TrainingArguments
        import _training
        out = {"device": str(Accelerator().device)}
        out["compile_backend"] = TrainingArguments("out", torch_compile=True, report_to=[]).torch_compile_backend
        try:
            DynamoBackend("TPU")
            out["tpu_backend"] = True
        except ValueError:
            out["tpu_backend"] = False
        run = _training.trainer("out", use_cpu=False, max_steps=2)
        out["collate"] = type(run.get_train_dataloader().base_dataloader.collate_fn).__name__
        run.train()
        inner = run.optimizer.optimizer
        out["lr"] = type(inner.param_groups[0]["lr"]).__name__
        out["capturable"] = bool(inner.defaults.get("capturable"))
        out["model"] = type(run.model_wrapped).__name__
        out["active"] = transformers_tpu_ext.active_patches()
        report(out)
        """.replace("TESTS", repr(os.path.dirname(__file__))),
        env={"OMP_NUM_THREADS": "1"},
    )
    assert set(TRAINING_PATCHES) <= set(result["active"])
    assert result["device"] == "cpu" and result["compile_backend"] == "inductor" and not result["tpu_backend"]
    assert result["collate"] == "RemoveColumnsCollator" and result["lr"] == "float" and not result["capturable"]
    assert result["model"] == "Qwen3ForCausalLM"


# -- the simulator: pinned host memory --------------------------------------------------------------


def test_simulator_pins_host_memory(simulated_tpu):
    host = torch.arange(6.0).reshape(2, 3)
    pinned = host.pin_memory()
    assert pinned.is_pinned() and pinned[1:].is_pinned() and not host.is_pinned()
    assert torch.equal(pinned, host)
    loader = torch.utils.data.DataLoader([torch.ones(3)] * 4, batch_size=2, pin_memory=True)
    assert all(batch.is_pinned() for batch in loader)
    assert torch.equal(pinned.to("tpu", non_blocking=True).cpu(), host)


def test_dynamo_backend_accepts_tpu_only_on_tpu(simulated_tpu):
    from accelerate.utils import DynamoBackend, TorchDynamoPlugin

    plugin = TorchDynamoPlugin(backend="tpu")
    assert plugin.backend is DynamoBackend("TPU") and plugin.dynamic is False
    assert plugin.to_kwargs()["backend"] == "tpu" and plugin.to_kwargs().get("dynamic", False) is False
    with patches_disabled("accelerate_dataclasses"):
        with pytest.raises(ValueError, match="not a valid DynamoBackend"):
            TorchDynamoPlugin(backend="tpu")
    assert os.environ.get("TRANSFORMERS_TPU_EXT_DISABLE") is None


def test_simulator_saves_casts_drops_out_and_synchronizes_like_a_device(simulated_tpu, tmp_path):
    # torch.save / torch.load(weights_only=True) of tpu tensors, map_location honoured
    path = tmp_path / "state.pt"
    torch.save({"w": torch.arange(4.0, device="tpu"), "step": torch.tensor(3.0, device="tpu")}, path)
    on_tpu, on_cpu = torch.load(path, weights_only=True), torch.load(path, weights_only=True, map_location="cpu")
    assert on_tpu["w"].device.type == "tpu" and on_cpu["w"].device.type == "cpu"
    assert on_tpu["w"].cpu().tolist() == on_cpu["w"].tolist() == [0.0, 1.0, 2.0, 3.0]
    # bf16 autocast on tpu: tests/simulator/test_autocast.py::test_lower_precision_values_equal_cpu_autocast
    # dropout draws from the TPU's generator, not the CPU's
    cpu_state, ones = torch.random.get_rng_state(), torch.ones(64, device="tpu")
    torch.tpu.manual_seed(3)
    first = torch.nn.functional.dropout(ones, 0.5).cpu()
    torch.tpu.manual_seed(3)
    assert torch.equal(torch.nn.functional.dropout(ones, 0.5).cpu(), first)
    assert torch.equal(torch.random.get_rng_state(), cpu_state)
    # torch.accelerator.synchronize() works and is counted
    before = simulated_tpu.synchronizations
    torch.accelerator.synchronize()
    assert simulated_tpu.synchronizations == before + 1


#: docs/training.md: "bf16 losses stay within 5e-3 of a CPU autocast run" (measured here).
BF16_TOLERANCE = 5e-3


@requires_trainer
def test_bf16_is_torch_tpu_autocast_close_to_but_not_cpu_autocast(simulated_tpu, tmp_path):
    # docs/simulated-tpu.md: the simulator follows torch_tpu's autocast policy, and runs PyTorch's
    # bfloat16 decompositions where the CPU has fused kernels, so bf16 losses are close, not equal.
    cpu = trainer(str(tmp_path / "cpu"), use_cpu=True, bf16=True, max_steps=6)
    cpu.train()
    tpu = trainer(str(tmp_path / "tpu"), use_cpu=False, bf16=True, max_steps=6)
    tpu.train()
    difference = max_diff(losses(tpu), losses(cpu))
    assert 0 < difference < BF16_TOLERANCE, difference
