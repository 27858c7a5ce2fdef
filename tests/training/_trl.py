"""Shared pieces of the TRL tests: the tiny datasets, the settings of the runs, and the callback that puts the
simulated TPU in cache-only mode (a new program raises) from the second epoch, or from the first step after a
warm-up, and counts what each step compiled."""

from __future__ import annotations

from typing import Any

import _training

from transformers_tpu_ext.testing.tiny import TINY_TEXT, tiny_lm_dataset

#: Per-step losses and metrics of the TPU run agree with the CPU run's to this (float32, tiny models).
TOLERANCE = 1e-3
COMMON = dict(
    per_device_train_batch_size=4, num_train_epochs=2, logging_steps=1, report_to=[], learning_rate=1e-3,
    save_strategy="no", seed=0, disable_tqdm=True, bf16=False,  # TRL's configs default to bf16
)


def steady(sim: Any, cache_only: bool = True, since: str = "epoch") -> Any:
    """A callback: cache-only mode from the second epoch (``since="epoch"``) or from the first step, after a
    ``warmup()`` (``since="step"``); ``steps``: the programs each step since then compiled; ``new``: what they
    were (kind and key)."""
    import torch
    from transformers import TrainerCallback

    class Steady(TrainerCallback):
        def __init__(self) -> None:
            self.steps: list = []
            self.new: list = []
            self._on = False

        def _begin(self, args: Any) -> None:
            if not args.use_cpu and not self._on:
                self._on = True
                self._entries = len(torch.tpu._get_cache_stats()["entries"])
                torch.tpu._set_cache_only(cache_only)

        def on_epoch_begin(self, args, state, control, **kwargs):
            if since == "epoch" and state.epoch and state.epoch >= 1:
                self._begin(args)

        def on_step_begin(self, args, state, control, **kwargs):
            if since == "step":
                self._begin(args)
            self._before = sim.counters()

        def on_step_end(self, args, state, control, **kwargs):
            if self._on:
                after = sim.counters() - self._before
                self.steps.append(after.graphs_compiled + after.eager_programs)

        def on_train_end(self, args, state, control, **kwargs):
            torch.tpu._set_cache_only(False)
            if self._on:
                self.new = [(e.get("kind"), str(e.get("key"))) for e in torch.tpu._get_cache_stats()["entries"][self._entries:]]

    return Steady()


def pairs(n: int = 12) -> Any:
    """Preference pairs of a few words each, of varied lengths."""
    import datasets

    words = " ".join(TINY_TEXT).split()
    rows: dict[str, list[str]] = {"prompt": [], "chosen": [], "rejected": []}
    for i in range(n):
        rows["prompt"].append(" ".join(words[i * 3: i * 3 + 2 + i % 5]))
        rows["chosen"].append(" " + " ".join(words[i * 5: i * 5 + 3 + i % 4]))
        rows["rejected"].append(" " + " ".join(words[i * 7 + 1: i * 7 + 2 + i % 6]))
    return datasets.Dataset.from_dict(rows)


def unpaired(n: int = 12) -> Any:
    """KTO's examples: the pairs' answers, each alone, desirable or not (the order the sampler shuffles)."""
    import datasets

    data = pairs(n)
    return datasets.Dataset.from_dict({
        "prompt": list(data["prompt"]) * 2, "completion": list(data["chosen"]) + list(data["rejected"]),
        "label": [True] * n + [False] * n,
    })


def sft_data(completion_only: bool = False, n: int = 16, max_length: int = 60) -> Any:
    import datasets

    ids = [row["input_ids"] for row in tiny_lm_dataset(n, seed=3, max_length=max_length)]
    columns: dict[str, Any] = {"input_ids": ids}
    if completion_only:
        columns["completion_mask"] = [[0] * (len(x) // 2) + [1] * (len(x) - len(x) // 2) for x in ids]
    return datasets.Dataset.from_dict(columns)


def lora() -> Any:
    from peft import LoraConfig

    return LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0, task_type="CAUSAL_LM")


def logged(trainer: Any, key: str) -> list[float]:
    return [e[key] for e in trainer.state.log_history if key in e and "train_runtime" not in e]


def like_cpu(cpu: Any, tpu: Any, keys: tuple[str, ...] = ()) -> None:
    """The TPU run's losses, and its logged ``keys``, are the CPU run's."""
    assert all(p.device.type == "tpu" for p in tpu.model.parameters())
    assert _training.max_diff(_training.losses(tpu), _training.losses(cpu)) < TOLERANCE
    for key in keys:
        got, want = logged(tpu, key), logged(cpu, key)
        assert got and _training.max_diff(got, want) < TOLERANCE, (key, got, want)
