"""TRL's trainers on the simulated TPU, plain vs the plugin, in one run: programs compiled in each epoch.

    python benchmarks/bench_trl.py            # full run (a few minutes on 2 cores)
    python benchmarks/bench_trl.py --quick    # smoke run
    python benchmarks/bench_trl.py --output benchmarks/results/trl.json

The workload: the tiny context-sensitive Qwen3-shaped model (``testing.tiny``, initializer_range 0.3), three
epochs, float32, TRL 1.16's trainers as their docs show them:

- ``reward``: ``RewardTrainer`` (a sequence classifier), 32 preference pairs (``tiny_preference_pairs``), batch 4;
- ``orpo``, ``cpo``: ``trl.experimental``'s ``ORPOTrainer`` and ``CPOTrainer`` on the same pairs;
- ``kto``: ``KTOTrainer`` on the pairs' answers, each alone with its label (64 examples);
- ``dpo``: ``DPOTrainer`` with a reference model;
- ``sft``, ``sft_packed``: ``SFTTrainer`` on 48 token lists of 8 to 200 tokens, plain and ``packing=True``;
- ``sft_compiled``: the same with ``torch_compile=True`` and gradient accumulation 2 (batch 2).

Each side runs in its own subprocess (patches are process-global) and first trains each run on the CPU (the
reference; ``sft_compiled``'s reference is not compiled: inductor on a CPU takes minutes and computes the same):

- ``plain``: plain Transformers, Accelerate and TRL (``TRANSFORMERS_TPU_EXT_DISABLE=1``) on the simulated TPU;
- ``plugin``: transformers-tpu-ext, defaults;
- ``plugin_warmup``: the plugin after ``transformers_tpu_ext.training.warmup(trainer, max_length=...)``.

Printed JSON per side and trainer: programs compiled (graphs + eager per-shape programs) in each epoch (the
warm-up's in ``warmup_programs``), wall time of the TPU run, and the largest difference of the logged losses
from the CPU run's.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import warnings

from _common import emit, run_worker, worker_env, write_report

SIDES = {"plain": {"TRANSFORMERS_TPU_EXT_DISABLE": "1"}, "plugin": {}, "plugin_warmup": {}}
TRAINERS = ("reward", "orpo", "cpo", "kto", "dpo", "sft", "sft_packed", "sft_compiled")
#: The longest sequence of each run (``warmup(max_length=...)``): a pair's prompt and answer, a packed row.
LONGEST = {"sft": 200, "sft_packed": 1024, "sft_compiled": 200}


def _trainer(kind: str, out: str, sim, *, use_cpu: bool, quick: bool, callbacks: list):
    import datasets
    import torch
    import trl
    from accelerate.state import AcceleratorState, GradientState

    from transformers_tpu_ext.testing.tiny import tiny_config, tiny_lm_dataset, tiny_model, tiny_preference_pairs, tiny_tokenizer

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    tokenizer = tiny_tokenizer()
    tokenizer.padding_side = "right"
    settings = dict(
        output_dir=out, use_cpu=use_cpu, per_device_train_batch_size=4, num_train_epochs=3, logging_steps=1, report_to=[],
        learning_rate=1e-3, save_strategy="no", seed=0, disable_tqdm=True, bf16=False,
    )
    pairs = tiny_preference_pairs(12 if quick else 32, max_words=12)
    common = dict(processing_class=tokenizer, callbacks=callbacks)
    if kind == "reward":
        from transformers import AutoModelForSequenceClassification

        torch.manual_seed(0)
        model = AutoModelForSequenceClassification.from_config(tiny_config("qwen3", num_labels=1, pad_token_id=0))
        return trl.RewardTrainer(model=model, args=trl.RewardConfig(max_length=128, **settings),
                                 train_dataset=datasets.Dataset.from_dict(pairs), **common)
    if kind in ("orpo", "cpo"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from trl.experimental.cpo import CPOConfig, CPOTrainer
            from trl.experimental.orpo import ORPOConfig, ORPOTrainer
        config, trainer = (ORPOConfig, ORPOTrainer) if kind == "orpo" else (CPOConfig, CPOTrainer)
        return trainer(model=tiny_model("qwen3", seed=0), args=config(max_length=128, **settings),
                       train_dataset=datasets.Dataset.from_dict(pairs), **common)
    if kind == "kto":
        n = len(pairs["prompt"])
        data = {"prompt": pairs["prompt"] * 2, "completion": pairs["chosen"] + pairs["rejected"], "label": [True] * n + [False] * n}
        return trl.KTOTrainer(model=tiny_model("qwen3", seed=0), ref_model=tiny_model("qwen3", seed=0),
                              args=trl.KTOConfig(max_length=128, **settings), train_dataset=datasets.Dataset.from_dict(data), **common)
    if kind == "dpo":
        return trl.DPOTrainer(model=tiny_model("qwen3", seed=0), ref_model=tiny_model("qwen3", seed=0),
                              args=trl.DPOConfig(max_length=128, **settings), train_dataset=datasets.Dataset.from_dict(pairs), **common)
    ids = [row["input_ids"] for row in tiny_lm_dataset(16 if quick else 48, seed=3, max_length=200)]
    if kind == "sft_compiled":
        settings.update(per_device_train_batch_size=2, gradient_accumulation_steps=2, torch_compile=not use_cpu)
    config = trl.SFTConfig(max_length=256, packing=kind == "sft_packed", **settings)
    return trl.SFTTrainer(model=tiny_model("qwen3", seed=0), args=config,
                          train_dataset=datasets.Dataset.from_dict({"input_ids": ids}), **common)


def _epochs(sim):
    from transformers import TrainerCallback

    class Epochs(TrainerCallback):
        def __init__(self) -> None:
            self.programs: dict[int, int] = {}

        def on_step_begin(self, args, state, control, **kwargs):
            self._before = sim.counters()

        def on_step_end(self, args, state, control, **kwargs):
            after = sim.counters() - self._before
            epoch = max(int(-(-state.epoch // 1)), 1)  # the epoch this step belongs to (1-based)
            self.programs[epoch] = self.programs.get(epoch, 0) + after.graphs_compiled + after.eager_programs

    return Epochs()


def _losses(trainer) -> list[float]:
    return [e["loss"] for e in trainer.state.log_history if "loss" in e and "train_runtime" not in e]


def run_one(kind: str, side: str, sim, quick: bool) -> dict:
    import torch._dynamo

    with tempfile.TemporaryDirectory() as out:
        cpu = _trainer(kind, out, sim, use_cpu=True, quick=quick, callbacks=[])
        cpu.train()
        sim.reset_counters()  # each trainer compiles from scratch, whatever ran before it in this process
        torch._dynamo.reset()
        epochs = _epochs(sim)
        tpu = _trainer(kind, out, sim, use_cpu=False, quick=quick, callbacks=[epochs])
        before = sim.counters()
        warmed = None
        if side == "plugin_warmup":
            from transformers_tpu_ext.training import warmup

            warmed = warmup(tpu, max_length=LONGEST.get(kind, 128))
        start = time.perf_counter()
        tpu.train()
        wall = time.perf_counter() - start
        total = sim.counters() - before
    programs = [epochs.programs.get(e, 0) for e in (1, 2, 3)]
    losses, reference = _losses(tpu), _losses(cpu)
    report = {
        "programs_per_epoch": programs,
        "wall_s": round(wall, 2),
        "max_loss_diff_vs_cpu": round(max(abs(a - b) for a, b in zip(losses, reference)), 9),
        "params_device": sorted({str(p.device) for p in tpu.model.parameters()}),
    }
    if warmed is not None:
        report["warmup_programs"] = total.graphs_compiled + total.eager_programs - sum(programs)
        report["warmed_lengths"] = warmed.lengths
    return report


def worker(side: str, quick: bool, trainers: list[str]) -> dict:
    import torch

    from transformers_tpu_ext import testing

    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    sim = testing.install()
    result = {}
    for kind in trainers:
        try:
            result[kind] = run_one(kind, side, sim, quick)
        except Exception as error:  # noqa: BLE001 - what a user running it sees
            result[kind] = {"error": f"{type(error).__name__}: {str(error)[:200]}"}
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small smoke run")
    parser.add_argument("--output", help="also write the JSON to this file (e.g. benchmarks/results/trl.json)")
    parser.add_argument("--sides", default=",".join(SIDES), help="comma list of sides to run")
    parser.add_argument("--trainers", default=",".join(TRAINERS), help="comma list of trainers to run")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    trainers = args.trainers.split(",")
    if args.worker:
        emit(worker(args.worker, args.quick, trainers))
        return 0
    started = time.perf_counter()
    report: dict = {"workload": {"quick": args.quick, "epochs": 3, "trainers": trainers}}
    for side in args.sides.split(","):
        extra = ["--quick"] if args.quick else []
        report[side] = run_worker(__file__, ["--worker", side, "--trainers", args.trainers, *extra],
                                  worker_env(TRL_EXPERIMENTAL_SILENCE="1", **SIDES[side]))
    report["bench_wall_s"] = round(time.perf_counter() - started, 1)
    write_report(report, args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
