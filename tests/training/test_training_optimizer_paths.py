"""Issue 19, items 1, 11 (optimizer.pt portability, resuming a CPU checkpoint) and 13 (the learning rate users read).

Each test runs the same script twice: on plain CPU with every patch of the plugin off, and on the
simulated TPU with the plugin; both must agree. Models: the tiny context-sensitive Llama (untied
embeddings: rows of tokens a batch does not use get an exactly zero gradient, as in any real model).
"""

from __future__ import annotations

import math
import os

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import _paths  # noqa: E402
import _training  # noqa: E402
from _paths import TOLERANCE, both, losses, max_diff, reference_run  # noqa: E402
from _training import requires_trainer  # noqa: E402
from transformers_tpu_ext.testing.tiny import tiny_lm_dataset  # noqa: E402


def _lm_collator():
    return _training.collator()


def _finite(values) -> bool:
    return all(math.isfinite(v) for v in values)


# -- item 1: a schedule that starts at (or decays to) learning rate 0 ------------------------------------


def _accelerate_loop(cpu: bool, make_optimizer, steps: int, warmup: int, total: int, seed: int = 0, compiled: bool = False):
    """A plain Accelerate loop (the one of docs/training.md) on the tiny Llama; per-step losses and
    the parameters (on the host) before and after every step. ``compiled``: on the TPU, with
    Accelerate's ``tpu`` dynamo backend (model and optimizer step compiled)."""
    from accelerate import Accelerator
    from transformers import get_linear_schedule_with_warmup

    _training.reset_accelerate()
    accelerator = Accelerator(cpu=cpu) if cpu or not compiled else Accelerator(dynamo_backend="tpu")
    model = _paths.causal_lm("llama", seed=seed).train()
    optimizer = make_optimizer(model.parameters())
    schedule = get_linear_schedule_with_warmup(optimizer, warmup, total)
    data = [{"input_ids": ids} for ids in _paths.token_lists(4 * steps, 8, 40, seed=seed)]
    loader = torch.utils.data.DataLoader(data, batch_size=4, collate_fn=_lm_collator())
    model, optimizer, loader, schedule = accelerator.prepare(model, optimizer, loader, schedule)
    seen, snapshots, rates = [], [], []
    host = lambda: [p.detach().to("cpu", copy=True) for p in model.parameters()]  # noqa: E731
    for batch in loader:
        rates.append(schedule.get_last_lr()[0])
        before = host()
        loss = model(**batch).loss
        accelerator.backward(loss)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad()
        seen.append(loss.item())
        snapshots.append((before, host()))
    return seen, snapshots, [float(r) for r in rates]


def test_accelerate_loop_adamw_with_linear_warmup_from_lr_0_matches_cpu(simulated_tpu):
    """Item 1: `torch.optim.AdamW` + `get_linear_schedule_with_warmup` in a plain Accelerate loop: step 1
    runs at learning rate 0. Before the fix, every parameter was NaN after it (capturable Adam divides by the lr)."""
    run = lambda cpu: _accelerate_loop(cpu, lambda p: torch.optim.AdamW(p, lr=1e-3), steps=4, warmup=2, total=6)  # noqa: E731
    (cpu, _, rates), (tpu, _, _) = both(run)
    assert rates[0] == 0.0
    assert _finite(tpu), f"TPU losses {tpu} (CPU {cpu})"
    assert max_diff(tpu, cpu) < TOLERANCE, (tpu, cpu)


@pytest.mark.slow
@pytest.mark.parametrize(
    "make, compiled",
    [
        pytest.param(lambda p: torch.optim.Adam(p, lr=1e-3), False, id="Adam"),
        pytest.param(lambda p: torch.optim.AdamW(p, lr=1e-3, weight_decay=0.1, foreach=False), False, id="AdamW-foreach=False"),
        pytest.param(lambda p: torch.optim.AdamW(p, lr=1e-3, foreach=True), False, id="AdamW-foreach=True"),
        pytest.param(lambda p: torch.optim.AdamW(p, lr=1e-3, weight_decay=0.1, fused=True), False, id="AdamW-fused"),
        pytest.param(lambda p: torch.optim.AdamW(p, lr=1e-3, weight_decay=0.1), True, id="AdamW-compiled"),
        pytest.param(lambda p: torch.optim.AdamW(p, lr=1e-3, foreach=False), True, id="AdamW-foreach=False-compiled"),
    ],
)
def test_user_adam_is_exact_at_lr_0_and_at_the_end_of_a_linear_decay(simulated_tpu, make, compiled):
    """Item 1: a user-made Adam/AdamW. A step at learning rate 0 leaves every parameter exactly as it was
    (CPU does), at the warm-up's first step and once the linear decay has reached 0 (6 steps of a
    4-step schedule); every other step matches the CPU. Also with the step compiled by the ``tpu``
    dynamo backend (TorchDynamo traces an Adam step as capturable: a single-tensor one must not be
    compiled)."""
    run = lambda cpu: _accelerate_loop(cpu, make, steps=6, warmup=1, total=4, compiled=compiled)  # noqa: E731
    (cpu, _, rates), (tpu, snapshots, _) = both(run)
    zero_steps = [i for i, rate in enumerate(rates) if rate == 0.0]
    assert zero_steps == [0, 4, 5], rates
    for i in zero_steps:
        before, after = snapshots[i]
        changed = [j for j, (b, a) in enumerate(zip(before, after)) if not torch.equal(b, a)]
        assert not changed, f"step {i + 1} at lr 0 changed parameters {changed} (NaN: {any(a.isnan().any() for a in after)})"
    assert _finite(tpu) and max_diff(tpu, cpu) < TOLERANCE, (tpu, cpu)


@requires_trainer
def test_trainer_adamw_torch_with_warmup_steps_matches_cpu(simulated_tpu, tmp_path):
    """Item 1: `Trainer(optim="adamw_torch", warmup_steps=2)`: the first step runs at lr 0; before the fix the
    following steps logged NaN-filtered losses (0.0) instead of the CPU's."""

    def run(cpu: bool):
        trainer = _paths.trainer(
            tmp_path / ("cpu" if cpu else "tpu"), cpu=cpu, model=_paths.causal_lm("llama"),
            train=tiny_lm_dataset(24), collator=_lm_collator(), optim="adamw_torch", warmup_steps=2,
        )
        trainer.train()
        return losses(trainer), [p.detach().cpu() for p in trainer.model.parameters()]

    (cpu, _), (tpu, params) = both(run)
    assert not any(p.isnan().any() for p in params), "NaN parameters after training on TPU"
    assert max_diff(tpu, cpu) < TOLERANCE, (tpu, cpu)


@requires_trainer
def test_peft_lora_with_warmup_matches_cpu(simulated_tpu, tmp_path):
    """Item 1: PEFT LoRA with warm-up (lora_B starts at 0, so lora_A's first gradient is exactly 0)."""
    peft = pytest.importorskip("peft")

    def run(cpu: bool):
        model = peft.get_peft_model(
            _paths.causal_lm("qwen3"), peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
        )
        trainer = _paths.trainer(
            tmp_path / ("cpu" if cpu else "tpu"), cpu=cpu, model=model, train=tiny_lm_dataset(24),
            collator=_lm_collator(), optim="adamw_torch", warmup_steps=2, learning_rate=1e-2,
        )
        trainer.train()
        return losses(trainer)

    cpu, tpu = both(run)
    assert _finite(tpu) and 0.0 not in tpu, tpu
    assert max_diff(tpu, cpu) < TOLERANCE, (tpu, cpu)


# -- item 13: the learning rate users and Transformers read is a float ---------------------------------


@pytest.mark.slow
@requires_trainer
@pytest.mark.parametrize("schedule", ["reduce_lr_on_plateau", "greedy"])
def test_learning_rate_users_read_is_a_float(simulated_tpu, tmp_path, schedule):
    """Item 13: `optimizer.param_groups[0]["lr"]` and the schedule's `get_last_lr()` are what the user's
    code expects: floats. Transformers' own test_reduce_lr_on_plateau logs `get_last_lr()[0]` from a
    Trainer subclass; before the fix that was a TPU tensor and writing trainer_state.json raised
    `TypeError: Object of type TpuTensor is not JSON serializable`."""
    from transformers import Trainer, TrainerCallback

    class LoggingTrainer(Trainer):  # the pattern of Transformers' test_reduce_lr_on_plateau
        def log(self, logs, *args, **kwargs):
            logs["scheduled_lr"] = self.lr_scheduler.get_last_lr()[0]
            super().log(logs, *args, **kwargs)

    class ReadLearningRate(TrainerCallback):
        def __init__(self):
            self.types = set()

        def on_step_end(self, args, state, control, optimizer=None, **kwargs):
            self.types.add(type(optimizer.param_groups[0]["lr"]).__name__)

    def run(cpu: bool):
        reader = ReadLearningRate()
        trainer = _paths.trainer(
            tmp_path / ("cpu" if cpu else "tpu"), cpu=cpu, model=_paths.causal_lm("qwen3"),
            train=tiny_lm_dataset(24), evaluation=tiny_lm_dataset(8, seed=3), trainer_class=LoggingTrainer,
            collator=_lm_collator(), optim="adamw_torch", lr_scheduler_type=schedule, max_steps=4,
            eval_strategy="steps", eval_steps=2, save_strategy="steps", save_steps=2, callbacks=[reader],
        )
        trainer.train()
        rates = [entry["scheduled_lr"] for entry in trainer.state.log_history if "scheduled_lr" in entry]
        return rates, losses(trainer), reader.types

    (cpu_rates, cpu_losses, _), (tpu_rates, tpu_losses, tpu_types) = both(run)
    assert tpu_types == {"float"}, tpu_types
    assert all(type(rate) is float for rate in tpu_rates), [type(r).__name__ for r in tpu_rates]
    assert tpu_rates == pytest.approx(cpu_rates) and max_diff(tpu_losses, cpu_losses) < TOLERANCE
    assert os.path.isfile(tmp_path / "tpu" / "checkpoint-4" / "trainer_state.json")


# -- item 11: optimizer checkpoints move between a TPU and a host without one --------------------------


@requires_trainer
@pytest.mark.slow
def test_tpu_checkpoint_resumes_on_a_host_without_a_tpu(simulated_tpu, tmp_path):
    """Item 11: a checkpoint written on the TPU resumes on a CPU-only host (no torch_tpu, no simulator),
    as a GPU checkpoint does. Before the fix, scheduler.pt held TPU tensors (loaded without map_location) and
    optimizer.pt a tensor lr with capturable=True, which a CPU optimizer refuses."""
    from _subprocess import run_python

    common = dict(model=_paths.causal_lm("qwen3"), train=tiny_lm_dataset(24), collator=_lm_collator(),
                  optim="adamw_torch", max_steps=4, save_strategy="steps", save_steps=2)
    full = _paths.trainer(tmp_path / "tpu", cpu=False, **common)
    full.train()
    checkpoint = tmp_path / "tpu" / "checkpoint-2"
    result, _ = run_python(
        r"""
        import sys, torch
        sys.path[:0] = [TESTS, HERE]
        torch.set_num_threads(1)
        import _paths, _training
        from transformers_tpu_ext.testing.tiny import tiny_lm_dataset
        trainer = _paths.trainer(OUT, cpu=True, model=_paths.causal_lm("qwen3", seed=1),
                                 train=tiny_lm_dataset(24), collator=_training.collator(),
                                 optim="adamw_torch", max_steps=4, save_strategy="steps", save_steps=2)
        try:
            trainer.train(resume_from_checkpoint=CHECKPOINT)
            report({"losses": _paths.losses(trainer)})
        except Exception as error:
            report({"error": f"{type(error).__name__}: {error}"[:300]})
        """.replace("TESTS", repr(os.path.dirname(_training.__file__))).replace("HERE", repr(os.path.dirname(__file__)))
        .replace("OUT", repr(str(tmp_path / "cpu"))).replace("CHECKPOINT", repr(str(checkpoint))),
        env={"OMP_NUM_THREADS": "1", "TRANSFORMERS_TPU_EXT_SIMULATE": None},
    )
    assert "error" not in result, result["error"]
    assert max_diff(result["losses"][-2:], losses(full)[-2:]) < TOLERANCE


@requires_trainer
@pytest.mark.slow
def test_resuming_a_cpu_checkpoint_keeps_the_optimizer_step_compiled_once(simulated_tpu, tmp_path):
    """Item 11: a checkpoint written on CPU, resumed on the TPU with torch_compile: the optimizer must
    stay adapted (its compiled step compiles once). Before the fix, `load_state_dict` put back the CPU's float
    lr and capturable=False, and the compiled step recompiles at every step of the schedule."""
    data = tiny_lm_dataset(48, min_length=20, max_length=30)  # one sequence bucket (32)
    common = dict(train=data, collator=_lm_collator(), optim="adamw_torch", max_steps=8, save_strategy="steps",
                  save_steps=4)
    with reference_run():
        cpu = _paths.trainer(tmp_path / "cpu", cpu=True, model=_paths.causal_lm("qwen3"), **common)
        cpu.train()
    counter = _training.step_counter(simulated_tpu)
    resumed = _paths.trainer(tmp_path / "tpu", cpu=False, model=_paths.causal_lm("qwen3", seed=1),
                             callbacks=[counter], torch_compile=True, **common)
    resumed.train(resume_from_checkpoint=str(tmp_path / "cpu" / "checkpoint-4"))
    graphs = [c.graphs_compiled for c in counter.steps]
    assert max_diff(losses(resumed)[-4:], losses(cpu)[-4:]) < TOLERANCE
    # the first resumed step compiles the model and the optimizer step; nothing after it
    assert sum(graphs[1:]) == 0, graphs
