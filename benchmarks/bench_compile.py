"""Programs compiled at the first and at the second start, on the simulated TPU, with and without the plugin.

    python benchmarks/bench_compile.py            # full run (about 15 minutes on 2 busy cores)
    python benchmarks/bench_compile.py --quick    # smoke run (about 8 minutes on 2 busy cores)
    python benchmarks/bench_compile.py --output benchmarks/results/compile.json

A *start* is a fresh process that does a fixed workload on a tiny context-sensitive Qwen3-shaped
model; each (work, side) starts twice, with one persistent-cache directory for both starts (the
simulated TPU keeps programs as torch_tpu does: ``TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT``). Works:

- ``generate``: mixed greedy ``generate()`` calls (batch 1-3, prompts and ``max_new_tokens`` of
  ``bench_generate.mixed_workload``); the plugin side warms up first (``warmup(model, ...)`` for the
  workload's limits);
- ``serve``: a ``ContinuousBatchingManager``: ``warmup()``, then the requests of ``bench_serve.workload``;
- ``train``: a ``Trainer`` (batch 4, sequences of 8-120 tokens); the plugin side calls
  ``warmup(trainer, max_length=120)``.

Sides:

- ``plain``: plain Transformers (``TRANSFORMERS_TPU_EXT_DISABLE=1``), nothing set: torch_tpu keeps no
  program across processes;
- ``plain_cache``: plain Transformers with ``TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT`` set by hand:
  what torch_tpu's cache alone gives;
- ``plugin``: transformers-tpu-ext with its defaults. On a TPU VM the cache is on by default; the
  simulated TPU is not on the PCI bus, so this side sets ``TRANSFORMERS_TPU_EXT_COMPILE_CACHE=on``
  (with ``HF_HOME`` in the run's temporary directory: the default directory layout).

Printed JSON per work and side: for each start, the programs compiled (graphs + eager per-shape
programs), the programs loaded from the persistent cache, the cache entries after it, wall time, and
whether the tokens (losses for training) equal the CPU run's and the other start's.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

from _common import emit, run_worker, worker_env, write_report

HERE = Path(__file__).resolve().parent
WORKS = ("generate", "serve", "train")
SIDES = ("plain", "plain_cache", "plugin")


def sizes(quick: bool) -> dict:
    if quick:
        return {"calls": 4, "max_prompt": 24, "max_new": 4, "requests": 6, "serve_prompt": 24, "serve_new": 4,
                "in_flight": 3, "steps": 4, "examples": 16, "train_max": 40, "hbm": "96MiB",
                "serve_env": {"TRANSFORMERS_TPU_EXT_SERVE_MAX_BATCH_TOKENS": "32", "TRANSFORMERS_TPU_EXT_SERVE_MAX_REQUESTS": "4"}}
    return {"calls": 12, "max_prompt": 200, "max_new": 32, "requests": 24, "serve_prompt": 200, "serve_new": 32,
            "in_flight": 8, "steps": 12, "examples": 48, "train_max": 120, "hbm": "256MiB", "serve_env": {}}


# -------------------------------------------------------------------------------------------------
# Worker side: one start


def _generate(sim, plugin: bool, cfg: dict) -> dict:
    import torch

    from bench_generate import mixed_workload
    from transformers_tpu_ext.testing.tiny import check_context_sensitive, tiny_model

    model = tiny_model("qwen3", seed=0)
    check_context_sensitive(model)
    work = mixed_workload(cfg["calls"], cfg["max_prompt"], cfg["max_new"])
    gen = torch.Generator().manual_seed(0)
    calls = [(torch.randint(2, 300, (b, n), generator=gen), new) for b, n, new in work]
    reference = [model.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False) for ids, new in calls]
    model.to("tpu")
    sim.reset_counters()
    start = time.perf_counter()
    if plugin:
        import transformers_tpu_ext

        transformers_tpu_ext.warmup(model, max_prompt_length=cfg["max_prompt"], max_new_tokens=cfg["max_new"],
                                    max_batch_size=max(b for b, _, _ in work))
    outputs = [model.generate(ids.to("tpu"), max_new_tokens=new, min_new_tokens=new, do_sample=False).cpu()
               for ids, new in calls]
    return {"seconds": time.perf_counter() - start,
            "match_cpu": all(torch.equal(o, r) for o, r in zip(outputs, reference)),
            "result": [o.tolist() for o in outputs]}


def _serve(sim, plugin: bool, cfg: dict) -> dict:
    import torch
    from transformers import ContinuousBatchingConfig, GenerationConfig

    from bench_serve import workload
    from transformers_tpu_ext.testing.tiny import tiny_model

    model = tiny_model("qwen3", seed=0)
    work = workload(cfg["requests"], cfg["serve_prompt"], cfg["serve_new"])
    gen = torch.Generator().manual_seed(1234)
    prompts = [torch.randint(2, model.config.vocab_size, (n,), generator=gen).tolist() for n, _ in work]
    reference = [model.generate(torch.tensor([p]), max_new_tokens=n, min_new_tokens=n, do_sample=False)[0, len(p):].tolist()
                 for p, (_, n) in zip(prompts, work)]
    model.to("tpu")
    sim.reset_counters()
    start = time.perf_counter()
    config = GenerationConfig(do_sample=False, eos_token_id=1, pad_token_id=0)
    manager = model.init_continuous_batching(
        generation_config=config, continuous_batching_config=None if plugin else ContinuousBatchingConfig(num_blocks=64)
    )
    manager.warmup()
    manager.start()
    outputs: dict[str, list[int]] = {}
    pending, in_flight = list(range(len(work))), 0
    try:
        while len(outputs) < len(work):
            while pending and in_flight < cfg["in_flight"]:
                i = pending.pop(0)
                manager.add_request(prompts[i], request_id=f"r{i}", max_new_tokens=work[i][1])
                in_flight += 1
            out = manager.get_result(timeout=300)
            if out is None:
                raise RuntimeError("the manager stopped answering")
            if out.is_finished():
                if out.error:
                    raise RuntimeError(out.error)
                outputs[out.request_id] = out.generated_tokens
                in_flight -= 1
    finally:
        manager.stop(block=True)
    result = [outputs[f"r{i}"] for i in range(len(work))]
    return {"seconds": time.perf_counter() - start, "match_cpu": result == reference, "result": result}


def _train(sim, plugin: bool, cfg: dict, workdir: str) -> dict:
    from transformers import DataCollatorForLanguageModeling, Trainer, TrainingArguments

    from transformers_tpu_ext.testing.tiny import tiny_lm_dataset, tiny_model, tiny_tokenizer

    tokenizer = tiny_tokenizer()
    tokenizer.padding_side = "right"
    data = tiny_lm_dataset(num_examples=cfg["examples"], max_length=cfg["train_max"])

    def run(use_cpu: bool) -> tuple:
        from accelerate.state import AcceleratorState

        AcceleratorState._reset_state(reset_partial_state=True)
        args = TrainingArguments(output_dir=workdir, per_device_train_batch_size=4, max_steps=cfg["steps"], report_to=[],
                                 logging_steps=1, learning_rate=1e-3, save_strategy="no", seed=0, disable_tqdm=True,
                                 use_cpu=use_cpu)
        trainer = Trainer(model=tiny_model("qwen3", seed=0), args=args, train_dataset=data,
                          data_collator=DataCollatorForLanguageModeling(tokenizer, mlm=False))
        if plugin and not use_cpu:
            import transformers_tpu_ext

            transformers_tpu_ext.warmup(trainer, max_length=cfg["train_max"])
        trainer.train()
        return [e["loss"] for e in trainer.state.log_history if "loss" in e], trainer

    reference, _ = run(use_cpu=True)
    sim.reset_counters()
    start = time.perf_counter()
    try:
        losses, trainer = run(use_cpu=False)
    except Exception as error:  # noqa: BLE001 - plain Transformers cannot train on the TPU (bench_train.py)
        return {"seconds": time.perf_counter() - start, "error": f"{type(error).__name__}: {str(error)[:200]}"}
    on_tpu = all(p.device.type == "tpu" for p in trainer.model.parameters())
    return {"seconds": time.perf_counter() - start, "on_tpu": on_tpu,
            "match_cpu": max(abs(a - b) for a, b in zip(losses, reference)) < 1e-4, "result": losses}


def worker(work: str, side: str, quick: bool) -> dict:
    from transformers_tpu_ext import testing

    cfg = sizes(quick)
    sim = testing.install(chips=1, hbm_bytes=cfg["hbm"])
    plugin = side == "plugin"
    with tempfile.TemporaryDirectory() as workdir:
        if work == "generate":
            result = _generate(sim, plugin, cfg)
        elif work == "serve":
            result = _serve(sim, plugin, cfg)
        else:
            result = _train(sim, plugin, cfg, workdir)
    counters = sim.counters()
    cache = sim.compile_cache
    entries = sum(1 for _ in Path(cache.directory()).glob("*.bin")) if cache.directory() and os.path.isdir(cache.directory()) else 0
    result.update(
        compiled=counters.programs,
        graphs_compiled=counters.graphs_compiled,
        eager_programs=counters.eager_programs,
        loaded=counters.programs_loaded,
        cache_root=cache.root(),
        cache_entries=entries,
        seconds=round(result["seconds"], 2),
    )
    return result


# -------------------------------------------------------------------------------------------------
# Driver side


def _env(work: str, side: str, quick: bool, tmp: str) -> dict:
    changes: dict[str, str | None] = dict(sizes(quick)["serve_env"]) if work == "serve" else {}
    if side == "plain":
        changes["TRANSFORMERS_TPU_EXT_DISABLE"] = "1"
    elif side == "plain_cache":
        changes["TRANSFORMERS_TPU_EXT_DISABLE"] = "1"
        changes["TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT"] = os.path.join(tmp, "torch_tpu_cache")
    else:
        changes["TRANSFORMERS_TPU_EXT_COMPILE_CACHE"] = "on"
        changes["HF_HOME"] = os.path.join(tmp, "hf")
    env = worker_env(**changes)
    if side != "plain_cache":
        env.pop("TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT", None)
    return env


def run_pair(work: str, side: str, quick: bool) -> dict:
    """Two starts of ``work`` on ``side`` sharing one cache directory."""
    with tempfile.TemporaryDirectory() as tmp:
        env = _env(work, side, quick, tmp)
        args = ["--worker", work, side] + (["--quick"] if quick else [])
        first = run_worker(__file__, args, env)
        second = run_worker(__file__, args, env)
    same = first.get("result") == second.get("result") if "result" in first else None
    for start in (first, second):
        start.pop("result", None)
        start["cache_root"] = start["cache_root"] and start["cache_root"].replace(tmp, "$TMP")
    return {"first_start": first, "second_start": second, "same_result_both_starts": same}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small smoke run")
    parser.add_argument("--works", default=",".join(WORKS), help="comma list of works")
    parser.add_argument("--sides", default=",".join(SIDES), help="comma list of sides")
    parser.add_argument("--output", help="also write the JSON report to this file")
    parser.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        emit(worker(args.worker[0], args.worker[1], args.quick))
        return 0
    cfg = sizes(args.quick)
    report: dict = {"sizes": {k: v for k, v in cfg.items() if k != "serve_env"}}
    for work in args.works.split(","):
        report[work] = {side: run_pair(work, side, args.quick) for side in args.sides.split(",")}
    report["summary"] = {
        work: {side: [report[work][side]["first_start"].get("compiled"), report[work][side]["second_start"].get("compiled")]
               for side in report[work]}
        for work in args.works.split(",")
    }
    write_report(report, args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
