"""TRL's GRPOTrainer on the simulated TPU, with and without the plugin's GRPO padding, in one run.

    python benchmarks/bench_grpo.py            # full run (a few minutes on 2 cores)
    python benchmarks/bench_grpo.py --quick    # smoke run
    python benchmarks/bench_grpo.py --output benchmarks/results/grpo.json

The workload: the tiny context-sensitive Qwen3-shaped model (``testing.tiny``), prompts of 3 to 30
words, 2 greedy generations per prompt, completions of at most 24 tokens that stop early at one of
41 end-of-sequence ids (so their lengths vary), batch 4, ``beta=0.04`` (a reference model) and an
entropy bonus, four epochs (three with ``--quick``), fp32. Each side runs in its own subprocess (patches are process-global)
and first trains the same run on the CPU (the reference):

- ``before``: the plugin with the ``trl_grpo`` patch off (``TRANSFORMERS_TPU_EXT_DISABLE=trl_grpo``):
  generation through the plugin's ``generate()``, batches as TRL pads them (the state before issue 27);
- ``plugin``: transformers-tpu-ext, defaults;
- ``plugin_warmup``: the plugin after ``transformers_tpu_ext.training.warmup(trainer, max_length=128)`` (one step
  per prompt rung up to 128 tokens, and one whose completions all run to ``max_completion_length``).

Printed JSON per side: programs compiled (graphs + eager per-shape programs) in each epoch, wall time
of the TPU run, the largest difference of the logged losses and rewards from the CPU run's, and the
mean completion length against the padded one (the compute the padding adds).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from _common import emit, run_worker, worker_env, write_report

SIDES = {"before": {"TRANSFORMERS_TPU_EXT_DISABLE": "trl_grpo"}, "plugin": {}, "plugin_warmup": {}}


def _run(path: str, out: str, sim, *, use_cpu: bool, prompts: int, completion: int, epochs: int, warm: bool = False) -> tuple:
    import datasets
    import trl
    from transformers import TrainerCallback

    from transformers_tpu_ext.testing.tiny import TINY_TEXT, tiny_tokenizer

    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    words = " ".join(TINY_TEXT).split()
    start = [(i * 7) % (len(words) - 32) for i in range(prompts)]
    data = datasets.Dataset.from_dict({"prompt": [" ".join(words[s: s + 3 + (i * 5) % 28]) for i, s in enumerate(start)]})

    def reward(completions, **kwargs):
        return [len(set(text)) / (1 + len(text)) for text in completions]

    class Epochs(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            self._before = sim.counters()

        def on_step_end(self, args, state, control, **kwargs):
            after = sim.counters() - self._before
            epoch = max(int(-(-state.epoch // 1)), 1)  # the epoch this step belongs to (1-based)
            self.programs[epoch - 1] = self.programs.get(epoch - 1, 0) + after.graphs_compiled + after.eager_programs

    counter = Epochs()
    counter.programs = {}
    config = trl.GRPOConfig(
        output_dir=out, use_cpu=use_cpu, per_device_train_batch_size=4, num_generations=2,
        max_completion_length=completion, num_train_epochs=epochs, logging_steps=1, report_to=[], learning_rate=1e-2,
        save_strategy="no", seed=0, disable_tqdm=True, bf16=False, generation_kwargs={"do_sample": False},
        beta=0.04, entropy_coef=0.5,
    )
    trainer = trl.GRPOTrainer(model=path, reward_funcs=reward, args=config, train_dataset=data,
                              processing_class=tiny_tokenizer(), callbacks=[counter])
    if warm:
        from transformers_tpu_ext.training import warmup

        warmup(trainer, max_length=128)
    start = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - start
    logs = [e for e in trainer.state.log_history if "loss" in e and "train_runtime" not in e]
    return logs, [counter.programs[k] for k in sorted(counter.programs)], wall


def worker(side: str, quick: bool) -> dict:
    import torch

    from transformers_tpu_ext import testing
    from transformers_tpu_ext.testing.tiny import save_tiny_model

    torch.set_num_threads(1)
    sim = testing.install()
    prompts, completion, epochs = (8, 12, 3) if quick else (24, 24, 4)
    with tempfile.TemporaryDirectory() as tmp:
        path = save_tiny_model(Path(tmp) / "model")
        config = json.loads((path / "generation_config.json").read_text())
        config["eos_token_id"] = [1, *range(40, 80)]  # completions stop early, at varying lengths
        (path / "generation_config.json").write_text(json.dumps(config))
        cpu, _, _ = _run(str(path), str(Path(tmp) / "cpu"), sim, use_cpu=True, prompts=prompts, completion=completion, epochs=epochs)
        tpu, programs, wall = _run(str(path), str(Path(tmp) / "tpu"), sim, use_cpu=False, prompts=prompts, completion=completion,
                                   epochs=epochs, warm=side == "plugin_warmup")

    def diff(key: str) -> float:
        return max(abs(a[key] - b[key]) for a, b in zip(cpu, tpu))

    mean_length = sum(e["completions/mean_length"] for e in tpu) / len(tpu)
    return {
        "steps": len(tpu),
        "programs_per_epoch": programs,
        "programs_after_epoch1": sum(programs[1:]),
        "wall_s": round(wall, 2),
        "max_loss_diff_vs_cpu": diff("loss"),
        "max_reward_diff_vs_cpu": diff("reward"),
        "mean_completion_length": round(mean_length, 2),
        "max_completion_length": completion,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small smoke run")
    parser.add_argument("--output", help="also write the JSON to this file (e.g. benchmarks/results/grpo.json)")
    parser.add_argument("--sides", default=",".join(SIDES), help="comma list of sides to run")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        emit(worker(args.worker, args.quick))
        return 0
    report = {"workload": {"quick": args.quick}}
    for side in args.sides.split(","):
        extra = ["--quick"] if args.quick else []
        report[side] = run_worker(__file__, ["--worker", side, *extra], worker_env(**SIDES[side]))
    write_report(report, args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
