"""TRL's GRPOTrainer on TPU: its batches padded where ``training/grpo.py`` proves it exact (prompts to a
rung, completions and generate()'s output to max_completion_length), so the second epoch compiles
nothing (cache-only mode) and rewards and losses equal the CPU's, with and without a PEFT LoRA adapter."""

from __future__ import annotations

import pytest

from transformers_tpu_ext.core.length_readers import ModelLengths, Rotary
from transformers_tpu_ext.training import grpo, losses
from transformers_tpu_ext.training.buckets import sequence_ladder
from transformers_tpu_ext.training.losses import library_loss

GRPO = "trl.trainer.grpo_trainer.GRPOTrainer"
LADDER = sequence_ladder()
ROTARY = ModelLengths((Rotary("default"),))


def _facts(**changes):
    values = dict(loss=losses.KNOWN_LOSSES[GRPO], max_completion_length=256, lengths=ROTARY)
    values.update(changes)
    return grpo.GRPOFacts(**values)


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo"])
def test_every_grpo_loss_type_of_trl_1_16_is_read(loss_type):
    assert library_loss(GRPO, version="1.16.0", options={"loss_type": loss_type}) is losses.KNOWN_LOSSES[GRPO]
    reason = library_loss(GRPO, version="1.16.0", options={"loss_type": "my_loss"})
    assert isinstance(reason, str) and "loss_type='my_loss'" in reason


def test_a_known_grpo_run_pads_prompts_to_a_rung_and_completions_to_their_maximum():
    plan = grpo.grpo_path(_facts(), ladder=LADDER)
    assert plan == grpo.GRPOPlan(completion_length=256, max_new_tokens=256, ladder=LADDER, static_cache=True)
    assert not grpo.grpo_path(_facts(cache_implementation="dynamic"), ladder=LADDER).static_cache  # yours: kept
    assert [grpo.prompt_length(n, plan, ()) for n in (1, 16, 17, 33, 50)] == [16, 16, 32, 48, 64]
    assert grpo.prompt_length(20, plan, {48}) == 48  # a used rung at most 1.5x longer: no new program
    assert grpo.prompt_length(20, plan, {64}) == 32
    rounded = grpo.grpo_path(_facts(max_completion_length=100, pad_to_multiple_of=64), ladder=LADDER)
    assert (rounded.completion_length, rounded.max_new_tokens) == (128, 100)  # your multiple kept
    assert grpo.prompt_length(70, rounded, ()) == 128


@pytest.mark.parametrize(
    "changes, words",
    [
        ({"loss": library_loss(GRPO, version="1.16.0", options={"loss_type": "dapo", "use_liger_kernel": True})}, "Liger"),
        ({"generation": "vllm"}, "vLLM"),
        ({"generation": "continuous_batching"}, "continuous batching"),
        ({"generation": "rollout_func"}, "rollout_func"),
        ({"tools": True}, "tools"),
        ({"vision": True}, "vision-language"),
        ({"aux_loss": True}, "auxiliary loss"),
        ({"top_entropy_quantile": 0.2}, "top_entropy_quantile"),
        ({"causal_lm": False}, "causal LM"),
        ({"lengths": ModelLengths()}, "without rotary embeddings"),  # GPT-2's position table
        ({"lengths": ModelLengths((Rotary("dynamic", 4096),))}, "dynamic"),
        ({"lengths": ModelLengths((Rotary("longrope", 4096),))}, "longrope"),
        ({"lengths": ModelLengths((Rotary("my_rope"),))}, "my_rope"),
        ({"max_completion_length": None}, "max_completion_length"),
        ({"stop_tokens": False}, "does not cut"),
        ({"other_stops": ("stop_strings",)}, "stop_strings"),
        ({"position_readers": ("Llama 4's attn_temperature_tuning",)}, "reads absolute positions"),
        ({"loss": library_loss(GRPO, version="1.17.0", options={"loss_type": "dapo"})}, "< 1.17"),
    ],
)
def test_anything_not_read_is_left_as_trl_makes_it(changes, words):
    reason = grpo.grpo_path(_facts(**changes), ladder=LADDER)
    assert isinstance(reason, str) and words in reason, reason


torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
trl = pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")

import _training  # noqa: E402

from transformers_tpu_ext.testing.tiny import TINY_TEXT, save_tiny_model, tiny_tokenizer  # noqa: E402

TOLERANCE = 1e-3


def _prompts():
    words = " ".join(TINY_TEXT).split()
    return datasets.Dataset.from_dict({"prompt": [" ".join(words[i * 4: i * 4 + 3 + i % 6]) for i in range(8)]})


def _reward(completions, **kwargs):  # depends on the completion: rewards vary within and across steps
    return [len(set(text)) / (1 + len(text)) for text in completions]


def _epochs(sim, cache_only):
    """A callback: the programs each step compiled, cache-only mode from the second epoch on (a new
    program raises), and what the second epoch compiled (kind and key)."""
    from transformers import TrainerCallback

    class Epochs(TrainerCallback):
        def __init__(self):
            self.steps, self.new = [], []

        def on_epoch_begin(self, args, state, control, **kwargs):
            if state.epoch and state.epoch >= 1 and not args.use_cpu:
                self._entries = len(torch.tpu._get_cache_stats()["entries"])
                torch.tpu._set_cache_only(cache_only)

        def on_step_begin(self, args, state, control, **kwargs):
            self._before = sim.counters()

        def on_step_end(self, args, state, control, **kwargs):
            after = sim.counters() - self._before
            self.steps.append(after.graphs_compiled + after.eager_programs)

        def on_train_end(self, args, state, control, **kwargs):
            torch.tpu._set_cache_only(False)
            if not args.use_cpu:
                self.new = [(e.get("kind"), str(e.get("key"))) for e in torch.tpu._get_cache_stats()["entries"][self._entries:]]

    return Epochs()


def _grpo(tmp, sim, *, use_cpu, lora=False, stops=None, cache_only=True):
    """Two epochs of GRPO on the tiny context-sensitive Qwen3: greedy generation, two generations per
    prompt, a KL term (beta) against the reference model (LoRA: the adapter disabled) and an entropy
    bonus (greedy completions of one prompt are equal, so their advantages are 0; the bonus and the KL
    term make the policy move)."""
    _training.reset_accelerate()
    path = tmp / "model"
    if not path.exists():
        save_tiny_model(path)
        if stops:  # more end-of-sequence ids: completions stop early, at varying lengths
            import json

            config = json.loads((path / "generation_config.json").read_text())
            config["eos_token_id"] = [1, *stops]
            (path / "generation_config.json").write_text(json.dumps(config))
    tokenizer = tiny_tokenizer()
    config = trl.GRPOConfig(
        output_dir=str(tmp / ("cpu" if use_cpu else "tpu")), use_cpu=use_cpu, per_device_train_batch_size=4,
        num_generations=2, max_completion_length=12 if stops else 8, num_train_epochs=2, logging_steps=1,
        report_to=[], learning_rate=1e-2, save_strategy="no", seed=0, disable_tqdm=True, bf16=False,
        generation_kwargs={"do_sample": False}, beta=0.04, entropy_coef=0.5,
    )
    from peft import LoraConfig

    callback = _epochs(sim, cache_only)
    trainer = trl.GRPOTrainer(
        model=str(path), reward_funcs=_reward, args=config, train_dataset=_prompts(), processing_class=tokenizer,
        callbacks=[callback],
        peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0, task_type="CAUSAL_LM") if lora else None,
    )
    trainer.train()
    return trainer, callback


def _logged(trainer, key):
    return [entry[key] for entry in trainer.state.log_history if key in entry and "train_runtime" not in entry]


def _check_like_cpu(cpu, tpu):
    assert all(p.device.type == "tpu" for p in tpu.model.parameters())
    for key in ("loss", "reward", "rewards/_reward/mean", "kl", "entropy", "completions/mean_length"):
        got, want = _logged(tpu, key), _logged(cpu, key)
        assert len(got) == 8 and _training.max_diff(got, want) < TOLERANCE, (key, got, want)
    assert len(set(_logged(cpu, "reward"))) > 4  # rewards vary: the completions change with the prompts and the policy
    assert _training.max_diff(_logged(cpu, "kl")[-2:], [0.0, 0.0]) > 1e-4  # the policy moved from the reference


@pytest.mark.slow
@pytest.mark.parametrize("lora, stops", [(False, None), (True, None)], ids=["plain", "lora"])
def test_grpo_reaches_steady_state_like_cpu(simulated_tpu, tmp_path, lora, stops):
    from transformers_tpu_ext.training import patch_trl_grpo

    cpu, _ = _grpo(tmp_path, simulated_tpu, use_cpu=True, lora=lora, stops=stops)
    tpu, epochs = _grpo(tmp_path, simulated_tpu, use_cpu=False, lora=lora, stops=stops)
    _check_like_cpu(cpu, tpu)
    plan = tpu.__dict__[patch_trl_grpo._PLAN]
    assert plan is not None and plan.completion_length == (12 if stops else 8)
    if stops:  # completions of varying lengths: the completion padding is exercised too
        assert len(set(_logged(cpu, "completions/mean_length"))) > 3
    assert tpu.__dict__[patch_trl_grpo._USED] <= {16, 32}  # prompts of 3 to 8 words, in one or two rungs
    assert len(epochs.steps) == 8 and sum(epochs.steps[4:]) == 0, epochs.steps  # cache-only did not raise either
    assert epochs.new == []


@pytest.mark.slow
@pytest.mark.parametrize("lora", [False, True])
def test_grpo_completions_that_stop_early_equal_cpu(simulated_tpu, tmp_path, lora):
    """Completions that stop at an end-of-sequence token, at varying lengths: generate()'s output and
    the completions are padded to max_completion_length (the columns after the stop are never read)."""
    stops = list(range(40, 80))
    cpu, _ = _grpo(tmp_path, simulated_tpu, use_cpu=True, stops=stops, lora=lora)
    tpu, epochs = _grpo(tmp_path, simulated_tpu, use_cpu=False, stops=stops, lora=lora, cache_only=False)
    _check_like_cpu(cpu, tpu)
    assert len(set(_logged(cpu, "completions/mean_length"))) > 3  # the lengths vary
    # TRL 1.16 indexes by a count: eos_idx[is_eos.any(dim=1)] = ... (the completions that hold an
    # end-of-sequence token) and completions/*_terminated_length over lengths[~is_truncated]. On the host
    # (host_counts): no program per count (before: a tiny program per count not seen yet). What the second
    # epoch may still compile is one branch of TRL's metrics, for a batch with no terminated completion
    # (torch.zeros(1) and its mean, min, max), if no first-epoch batch took it; warmup() takes it
    # (tests/training/test_trl_trainers.py).
    branch = {"aten.zero_", "aten.mean", "aten.min", "aten.max"}
    others = [key for _, key in epochs.new if not (key.split("op='")[1].split("'")[0] in branch and "torch.Size([1])" in key)]
    assert others == [], [key[:160] for key in others]


@pytest.mark.slow
def test_without_the_patch_every_new_length_compiles(simulated_tpu, tmp_path):
    """The same run with the trl_grpo patch off: the second epoch compiles new programs (the check above fails)."""
    with _training.patches_disabled("trl_grpo"):
        _, epochs = _grpo(tmp_path, simulated_tpu, use_cpu=False, cache_only=False)
    assert sum(epochs.steps[4:]) > 100, epochs.steps


def test_trl_s_pad_is_asked_for_the_planned_lengths():
    from trl.trainer.utils import pad

    from transformers_tpu_ext.training import patch_trl_grpo

    class Trainer:  # what the wrapper reads off the trainer: the prompt rungs it used
        pass

    plan = grpo.grpo_path(_facts(max_completion_length=24), ladder=LADDER)
    rows = [torch.arange(1, 6), torch.arange(1, 3)]
    token = patch_trl_grpo._ACTIVE.set((plan, Trainer()))
    try:
        prompts = patch_trl_grpo._pad(pad, None, (rows,), {"padding_value": 0, "padding_side": "left"})
        completions = patch_trl_grpo._pad(pad, None, (rows, 0, "right"), {})
    finally:
        patch_trl_grpo._ACTIVE.reset(token)
    assert prompts.shape == (2, 16) and prompts[1, -2:].tolist() == [1, 2] and (prompts[1, :-2] == 0).all()
    assert completions.shape == (2, 24) and completions[0, :5].tolist() == [1, 2, 3, 4, 5] and (completions[0, 5:] == 0).all()
    assert patch_trl_grpo._pad(pad, None, (rows,), {}).shape == (2, 5)  # outside a GRPO batch: TRL's own


@pytest.mark.slow  # most of it is importing TRL's trainer and building it
def test_a_run_the_predicate_does_not_know_is_left_alone_and_said_once(simulated_tpu, tmp_path, caplog):
    from transformers_tpu_ext.training import patch_trl_grpo

    _training.reset_accelerate()
    save_tiny_model(tmp_path / "model")
    config = trl.GRPOConfig(output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, num_generations=2,
                            max_completion_length=8, report_to=[], bf16=False, top_entropy_quantile=0.5)
    trainer = trl.GRPOTrainer(model=str(tmp_path / "model"), reward_funcs=_reward, args=config, train_dataset=_prompts(),
                              processing_class=tiny_tokenizer())
    assert patch_trl_grpo._plan(trainer) is None
    assert any("top_entropy_quantile" in r.getMessage() for r in caplog.records)


@pytest.mark.slow
def test_the_benchmark_s_quick_plugin_side(simulated_tpu):
    """``benchmarks/bench_grpo.py --quick``'s plugin side, in this process: prompts of 3 to 30 words, early
    stops; the last epoch compiles nothing and losses and rewards are the CPU's."""
    import _bench
    from pathlib import Path

    bench = _bench.load(Path(__file__).resolve().parents[2] / "benchmarks" / "bench_grpo.py")
    report = bench.worker("plugin", quick=True)
    assert report["steps"] == 12 and report["programs_per_epoch"][-1] == 0, report
    assert report["max_loss_diff_vs_cpu"] < TOLERANCE and report["max_reward_diff_vs_cpu"] < TOLERANCE


def test_llama_4_s_attention_temperature_reads_absolute_positions():
    from transformers import Llama4TextConfig, Qwen3Config

    from transformers_tpu_ext.training.facts import _position_readers

    assert _position_readers(Llama4TextConfig(attn_temperature_tuning=True)) and not _position_readers(Qwen3Config())
    assert not _position_readers(Llama4TextConfig(attn_temperature_tuning=False))
