"""Training on the simulated TPU, with and without transformers-tpu-ext, in one run.

    python benchmarks/bench_train.py            # full run (several minutes on 2 cores)
    python benchmarks/bench_train.py --quick    # smoke run
    python benchmarks/bench_train.py --output benchmarks/results/train.json

The workload is the issue's: a tiny context-sensitive Qwen3-shaped causal LM (initializer_range
0.3), 96 sequences of 8..120 tokens (``testing.tiny.tiny_lm_dataset``), ``Trainer`` with batch 4,
24 steps, a linear schedule, fp32, plain code (``DataCollatorForLanguageModeling``). Each side runs
in its own subprocess (patches are process-global) and first computes the same run on the CPU:

- ``baseline``: plain Transformers/Accelerate (``TRANSFORMERS_TPU_EXT_DISABLE=1``) on the simulated
  TPU: what the Trainer, a plain Accelerate loop and ``torch_compile_backend="tpu"`` do.
  (Setting ``ACCELERATE_TORCH_DEVICE=tpu`` by hand does not rescue the Trainer: it fails the same way.)
- ``plugin``: transformers-tpu-ext, defaults; also a plain Accelerate loop and ``torch_compile=True``.
- ``plugin_no_buckets``: the plugin with ``TRANSFORMERS_TPU_EXT_TRAIN_BUCKETS=0``: batches padded to
  their longest sequence, as the collator makes them (what bucketing saves).
- ``plugin_warmup``: the plugin after ``transformers_tpu_ext.training.warmup(trainer, max_length=120)``.
- ``chips2`` / ``chips4``: the plugin on 2 and 4 simulated chips under ``transformers-tpu launch``,
  the same global batch (per-device batch 2 and 1).

Printed JSON: per-step losses against the CPU run, where the parameters live, programs compiled
(graphs + eager per-shape programs) in steps 1-12 and 13-24, host<->device bytes, wall time, and
the bucket policies of the workload's batches (distinct shapes, tokens computed / tokens needed).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import emit, run_worker, worker_env, write_report

HERE = Path(__file__).resolve().parent
BATCH = 4


def sizes(quick: bool) -> dict:
    return {"steps": 8 if quick else 24, "examples": 32 if quick else 96, "max_length": 120}


# -------------------------------------------------------------------------------------------------
# Worker side (one process per side, or per rank)


def _trainer(out: str, data, *, use_cpu: bool, steps: int, batch: int = BATCH, callbacks=(), **overrides):
    from accelerate.state import AcceleratorState
    from transformers import DataCollatorForLanguageModeling, Trainer, TrainingArguments

    from transformers_tpu_ext.testing.tiny import tiny_model, tiny_tokenizer

    AcceleratorState._reset_state(reset_partial_state=True)
    tokenizer = tiny_tokenizer()
    tokenizer.padding_side = "right"
    args = TrainingArguments(
        output_dir=out, per_device_train_batch_size=batch, max_steps=steps, logging_steps=1, report_to=[],
        learning_rate=1e-3, lr_scheduler_type="linear", save_strategy="no", seed=0, disable_tqdm=True,
        use_cpu=use_cpu, **overrides,
    )
    return Trainer(
        model=tiny_model("qwen3", seed=0), args=args, train_dataset=data,
        data_collator=DataCollatorForLanguageModeling(tokenizer, mlm=False), callbacks=list(callbacks),
    )


def _losses(trainer) -> list[float]:
    return [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]


def _counter(sim):
    from transformers import TrainerCallback

    class Counter(TrainerCallback):
        def __init__(self) -> None:
            self.steps: list = []

        def on_step_begin(self, args, state, control, **kwargs) -> None:
            self._before, self._start = sim.counters(), time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs) -> None:
            self.steps.append((sim.counters() - self._before, time.perf_counter() - self._start))

    return Counter()


def _digest(model) -> str:
    digest = hashlib.sha256()
    for name, param in sorted(model.named_parameters()):
        digest.update(name.encode())
        digest.update(param.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def _train_report(sim, trainer, counter, cpu_losses, wall: float, whole) -> dict:
    losses = _losses(trainer)
    steps = [c for c, _ in counter.steps]
    half = len(steps) // 2
    first = sum(c.programs for c in steps[:half])
    second = sum(c.programs for c in steps[half:])
    total = sum((c for c in steps), type(steps[0])())
    return {
        "params_device": sorted({str(p.device) for p in trainer.model.parameters()}),
        "accelerator_device": str(trainer.accelerator.device),
        "losses": [round(x, 6) for x in losses],
        "max_loss_diff_vs_cpu": round(max(abs(a - b) for a, b in zip(losses, cpu_losses)), 9),
        "programs_per_step": [c.programs for c in steps],
        "graphs_total": total.graphs_compiled,
        "programs_steps_1_12": first,
        "programs_steps_13_24": second,
        "second_half_pct_of_first": round(100 * second / first, 1) if first else 0.0,
        "h2d_bytes_per_step": round(whole.h2d_bytes / len(steps)),
        "d2h_bytes_per_step": round(whole.d2h_bytes / len(steps)),
        "wall_s": round(wall, 2),
        "median_step_ms_second_half": round(1e3 * sorted(t for _, t in counter.steps[half:])[len(steps[half:]) // 2], 1),
    }


def _timed_train(sim, trainer, cpu_losses) -> dict:
    counter = _counter(sim)
    trainer.add_callback(counter)
    before, start = sim.counters(), time.perf_counter()
    trainer.train()
    wall, whole = time.perf_counter() - start, sim.counters() - before
    return _train_report(sim, trainer, counter, cpu_losses, wall, whole)


def _accelerate_loop(data, steps: int) -> dict:
    """A plain Accelerate loop (user's own DataLoader, AdamW, linear schedule), CPU vs default device."""
    import torch
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState
    from transformers import DataCollatorForLanguageModeling, get_linear_schedule_with_warmup

    from transformers_tpu_ext.testing.tiny import tiny_model, tiny_tokenizer

    tokenizer = tiny_tokenizer()
    tokenizer.padding_side = "right"

    def loop(cpu: bool) -> tuple[list[float], str]:
        AcceleratorState._reset_state(reset_partial_state=True)
        accelerator = Accelerator(cpu=cpu)
        model = tiny_model("qwen3", seed=0).train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        schedule = get_linear_schedule_with_warmup(optimizer, 0, steps)
        loader = torch.utils.data.DataLoader(
            data[: steps * BATCH], batch_size=BATCH, collate_fn=DataCollatorForLanguageModeling(tokenizer, mlm=False)
        )
        model, optimizer, loader, schedule = accelerator.prepare(model, optimizer, loader, schedule)
        losses = []
        for batch in loader:
            loss = model(**batch).loss
            accelerator.backward(loss)
            optimizer.step()
            schedule.step()
            optimizer.zero_grad()
            losses.append(loss.item())
        return losses, str(accelerator.device)

    cpu, _ = loop(cpu=True)
    losses, device = loop(cpu=False)
    return {
        "accelerator_device": device,
        "max_loss_diff_vs_cpu": round(max(abs(a - b) for a, b in zip(losses, cpu)), 9),
    }


def worker(side: str, quick: bool) -> dict:
    import torch

    from transformers_tpu_ext import testing
    from transformers_tpu_ext.testing.tiny import tiny_lm_dataset

    torch.set_num_threads(1)
    sim = testing.install(chips=4)
    cfg = sizes(quick)
    data = tiny_lm_dataset(cfg["examples"], max_length=cfg["max_length"])
    out = tempfile.mkdtemp(prefix=f"bench_train_{side}_")
    cpu = _trainer(out, data, use_cpu=True, steps=cfg["steps"])
    cpu.train()
    cpu_losses = _losses(cpu)
    result: dict = {"side": side, "cpu_losses": [round(x, 6) for x in cpu_losses]}

    if side == "baseline":
        trainer = _trainer(out, data, use_cpu=False, steps=cfg["steps"])
        result["trainer_devices"] = {"args.device": str(trainer.args.device), "accelerator.device": str(trainer.accelerator.device)}
        try:  # Accelerate >= 1.16 finds the TPU itself: the plain Trainer then trains, compiling what it meets
            result["trainer_run"] = _timed_train(sim, trainer, cpu_losses)
            result["trainer"] = "trained"
        except Exception as error:  # noqa: BLE001 - what the user sees
            result["trainer"] = f"{type(error).__name__}: {str(error)[:160]}"
        result["accelerate_loop"] = _accelerate_loop(data, min(cfg["steps"], 6))
        try:
            _trainer(out, data, use_cpu=False, steps=1, torch_compile_backend="tpu")
            result["torch_compile_backend_tpu"] = "accepted"
        except Exception as error:  # noqa: BLE001
            result["torch_compile_backend_tpu"] = f"{type(error).__name__}: {str(error)[:160]}"
        return result

    if side in ("plugin_no_buckets", "plugin"):
        result["trainer"] = _timed_train(sim, _trainer(out, data, use_cpu=False, steps=cfg["steps"]), cpu_losses)
    if side == "plugin":
        result["batches"] = _batch_shapes(data, out)
        result["accelerate_loop"] = _accelerate_loop(data, min(cfg["steps"], 6))
        compiled = _trainer(out, data, use_cpu=False, steps=cfg["steps"], torch_compile=True, optim="adamw_torch")
        result["torch_compile"] = {"backend": compiled.args.torch_compile_backend, **_timed_train(sim, compiled, cpu_losses)}
    if side == "plugin_warmup":
        from transformers_tpu_ext.training import warmup

        trainer = _trainer(out, data, use_cpu=False, steps=cfg["steps"])
        warmed = warmup(trainer, max_length=cfg["max_length"])
        before, start = sim.counters(), time.perf_counter()
        first_step = {}

        from transformers import TrainerCallback

        class WarmupCost(TrainerCallback):
            def on_step_begin(self, args, state, control, **kwargs) -> None:
                if not first_step:
                    first_step.update(programs=(sim.counters() - before).programs, wall_s=round(time.perf_counter() - start, 2))

        trainer.add_callback(WarmupCost())
        result["trainer"] = _timed_train(sim, trainer, cpu_losses)
        result["warmup"] = {"lengths": warmed.lengths, **first_step}
    return result


def _batch_shapes(data, out: str) -> list[list[int]]:
    """``[rows, longest sequence, tokens]`` of each batch of the run, unpadded (bucketing off)."""
    os.environ["TRANSFORMERS_TPU_EXT_TRAIN_BUCKETS"] = "0"
    try:
        loader = _trainer(out, data, use_cpu=False, steps=1).get_train_dataloader()
        return [
            [int(b["attention_mask"].shape[0]), int(b["attention_mask"].sum(1).max()), int(b["attention_mask"].sum())]
            for b in loader
        ]
    finally:
        del os.environ["TRANSFORMERS_TPU_EXT_TRAIN_BUCKETS"]


def rank_worker(out_dir: str, quick: bool) -> None:
    """One rank under ``transformers-tpu launch``: the plugin side's run with the same global batch."""
    import torch

    from transformers_tpu_ext.testing.tiny import tiny_lm_dataset

    torch.set_num_threads(1)
    cfg = sizes(quick)
    world = int(os.environ["WORLD_SIZE"])
    data = tiny_lm_dataset(cfg["examples"], max_length=cfg["max_length"])
    trainer = _trainer(out_dir, data, use_cpu=False, steps=cfg["steps"], batch=BATCH // world)
    start = time.perf_counter()
    trainer.train()
    report = {
        "losses": _losses(trainer),
        "digest": _digest(trainer.model),
        "wrapper": type(trainer.model_wrapped).__name__,
        "backend": trainer.accelerator.state.backend,
        "device": str(trainer.accelerator.device),
        "wall_s": round(time.perf_counter() - start, 2),
    }
    Path(out_dir, f"rank{os.environ['RANK']}.json").write_text(json.dumps(report))


# -------------------------------------------------------------------------------------------------
# Parent side


def _env(**changes: str | None) -> dict:
    return worker_env(ACCELERATE_TORCH_DEVICE=None, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore", **changes)


def _run_worker(args: list[str], env: dict) -> dict:
    return run_worker(__file__, args, env)


def chips(nproc: int, quick: bool, reference: list[float] | None) -> dict:
    with tempfile.TemporaryDirectory(prefix=f"bench_train_chips{nproc}_") as out:
        env = _env(TRANSFORMERS_TPU_EXT_SIMULATE="generation=v5p")
        command = [
            sys.executable, "-m", "transformers_tpu_ext.launch", f"--nproc_per_node={nproc}",
            str(Path(__file__).resolve()), "--rank-worker", out, *(["--quick"] if quick else []),
        ]
        start = time.perf_counter()
        proc = subprocess.run(command, capture_output=True, text=True, env=env)
        wall = time.perf_counter() - start
        if proc.returncode != 0:
            raise RuntimeError(f"launch of {nproc} ranks failed:\n{proc.stderr[-4000:]}")
        ranks = [json.loads(Path(out, f"rank{r}.json").read_text()) for r in range(nproc)]
    losses = ranks[0]["losses"]
    return {
        "per_device_batch": BATCH // nproc,
        "wrapper": sorted({r["wrapper"] for r in ranks}),
        "backend": sorted({r["backend"] for r in ranks}),
        "device": sorted({r["device"] for r in ranks}),
        "params_identical_on_all_ranks": len({r["digest"] for r in ranks}) == 1,
        "losses_identical_on_all_ranks": all(r["losses"] == losses for r in ranks),
        "max_loss_diff_vs_one_process": (
            round(max(abs(a - b) for a, b in zip(losses, reference)), 9) if reference else None
        ),
        "launch_wall_s": round(wall, 1),
    }


def bucket_policies(batches: list[list[int]]) -> dict:
    """Distinct padded shapes and tokens computed / needed, per policy, on the run's batches."""
    from transformers_tpu_ext.training import buckets as batch_buckets
    from transformers_tpu_ext import ladders

    needed = sum(tokens for _, _, tokens in batches)

    def evaluate(choose) -> dict:
        used: set[int] = set()
        shapes, computed = set(), 0
        for rows, longest, _ in batches:
            length = choose(longest, used)
            used.add(length)
            shapes.add((BATCH, length))
            computed += BATCH * length
        return {"shapes": len(shapes), "padding_overhead": round(computed / needed, 3)}

    pow2 = batch_buckets.sequence_ladder(1)
    ladder = batch_buckets.sequence_ladder(2)
    longest_in_batch = {(rows, longest) for rows, longest, _ in batches}
    return {
        "longest_in_batch (upstream collators)": {
            "shapes": len(longest_in_batch),
            "padding_overhead": round(sum(r * n for r, n, _ in batches) / needed, 3),
        },
        "fixed_128 (pad to max_length)": evaluate(lambda n, used: 128),
        "pow2 ladder": evaluate(lambda n, used: ladders.round_up(n, pow2)),
        "2 rungs/octave, no reuse": evaluate(lambda n, used: batch_buckets.choose_length(n, ladder, used, 1.0)),
        "ours (2 rungs/octave, reuse 1.5)": evaluate(lambda n, used: batch_buckets.choose_length(n, ladder, used, 1.5)),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small smoke run")
    parser.add_argument("--output", help="also write the JSON to this file (e.g. benchmarks/results/train.json)")
    parser.add_argument(
        "--sides", default="baseline,plugin,plugin_no_buckets,plugin_warmup,chips2,chips4", help="comma list of sides to run"
    )
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--rank-worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    quick_flag = ["--quick"] if args.quick else []

    if args.worker:
        emit(worker(args.worker, args.quick))
        return 0
    if args.rank_worker:
        rank_worker(args.rank_worker, args.quick)
        return 0

    started = time.perf_counter()
    report: dict = {"quick": args.quick, "workload": {**sizes(args.quick), "batch": BATCH}}
    sides = args.sides.split(",")
    for side in (s for s in sides if not s.startswith("chips")):
        if side == "baseline":
            env = _env(TRANSFORMERS_TPU_EXT_DISABLE="1")
        elif side == "plugin_no_buckets":
            env = _env(TRANSFORMERS_TPU_EXT_TRAIN_BUCKETS="0")
        else:
            env = _env()
        report[side] = _run_worker(["--worker", side, *quick_flag], env)
    reference = report.get("plugin", {}).get("trainer", {}).get("losses")
    for side in (s for s in sides if s.startswith("chips")):
        report[side] = chips(int(side[len("chips"):]), args.quick, reference)
    if "plugin" in report:
        report["bucket_policies"] = bucket_policies(report["plugin"].pop("batches"))
    report["bench_wall_s"] = round(time.perf_counter() - started, 1)
    write_report(report, args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
