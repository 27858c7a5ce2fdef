"""Generation on the simulated TPU, with and without transformers-tpu-ext, in one run.

    python benchmarks/bench_generate.py            # full run (a few minutes on 2 cores)
    python benchmarks/bench_generate.py --quick    # smoke run
    python benchmarks/bench_generate.py --output benchmarks/results/run.json
    python benchmarks/bench_generate.py --family llava   # a vision-language or speech family (_families.py)
    python benchmarks/bench_generate.py --family mamba   # a state-space or hybrid family (_recurrent_families.py)

Each side runs in its own subprocess (patches are process-global). Two baselines, both plain
Transformers (``TRANSFORMERS_TPU_EXT_DISABLE=1``):

- ``plain``: ``generate()`` as written for a GPU (inputs ``.to(model.device)``, no cache argument:
  the dynamic cache), which the Google TPU guide tells users not to write;
- ``guide``: the guide's recipe (inputs left on the CPU, ``cache_implementation="static"``);

and two plugin sides: ``plugin`` (the plain GPU code) and ``plugin_warmup`` (the same after
``transformers_tpu_ext.warmup()``). Every side builds the same seeded, context-sensitive tiny
Qwen3-shaped model, computes the CPU reference tokens first, then moves the model to the simulated
``tpu`` and runs:

- ``tpu_inputs``: one prompt, three identical calls;
- ``mixed``: a fixed workload of varied batch sizes, prompt lengths and ``max_new_tokens``;
- ``decode_bytes``: host<->device bytes per row and decode step in steady state, with a
  32,000-token vocabulary, batch 1 and 8, inputs on the CPU and on the TPU, greedy, sampling and an
  option that needs the logits on the host (``repetition_penalty``: the host loop);
- ``prefill_bytes``: host<->device bytes of one prefill in steady state (a one-token call), a
  batch of 4 short prompts (one chunk) and 2 long ones (three chunks).

Printed JSON: programs compiled (graphs + eager per-shape programs) and their growth over the
second half, host<->device bytes, wall time, padding and attention overheads, tokens equal to the
CPU reference; the plugin's own overhead on ``import torch`` and on one CPU ``generate()`` (no
TPU); and the bucket policies of prior art evaluated on the same workload.
"""

from __future__ import annotations

import argparse
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _common import emit, run_worker, worker_env, write_report

HERE = Path(__file__).resolve().parent


def mixed_workload(calls: int, max_prompt: int, max_new: int, seed: int = 0) -> list[tuple[int, int, int]]:
    """``calls`` deterministic ``(batch, prompt_length, max_new_tokens)`` triples."""
    rng = random.Random(seed)
    return [(rng.choice((1, 1, 2, 3)), rng.randint(1, max_prompt), rng.randint(1, max_new)) for _ in range(calls)]


def sizes(quick: bool) -> dict:
    if quick:
        return {"calls": 6, "max_prompt": 40, "max_new": 6, "tpu_new": 6, "import_runs": 2, "cpu_runs": 5}
    return {"calls": 24, "max_prompt": 200, "max_new": 48, "tpu_new": 20, "import_runs": 7, "cpu_runs": 60}


# -------------------------------------------------------------------------------------------------
# Worker side (one process per side)


#: What each side passes to generate() (the guide's recipe asks for the static cache) and where its
#: inputs live (the guide leaves them on the CPU).
SIDES = {
    "plain": dict(kwargs={}, inputs_on_tpu=True, plugin=False),
    "guide": dict(kwargs={"cache_implementation": "static"}, inputs_on_tpu=False, plugin=False),
    "plugin": dict(kwargs={}, inputs_on_tpu=True, plugin=True),
    "plugin_warmup": dict(kwargs={}, inputs_on_tpu=True, plugin=True),
}


def worker(side: str, quick: bool) -> dict:
    import torch

    from transformers_tpu_ext import testing
    from transformers_tpu_ext.testing.tiny import check_context_sensitive, tiny_model

    sim = testing.install(chips=4)
    cfg = sizes(quick)
    how = SIDES[side]
    extra = how["kwargs"]
    model = tiny_model("qwen3", seed=0)
    check_context_sensitive(model)
    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(1234)
    workload = mixed_workload(cfg["calls"], cfg["max_prompt"], cfg["max_new"])
    prompts = [torch.randint(2, vocab, (b, p), generator=gen) for b, p, _ in workload]
    single = torch.randint(2, vocab, (1, 7), generator=gen)

    # CPU references (plain Transformers path: the plugin changes nothing without a TPU).
    reference = [model.generate(ids, max_new_tokens=n, do_sample=False) for ids, (_, _, n) in zip(prompts, workload)]
    single_ref = model.generate(single, max_new_tokens=cfg["tpu_new"], do_sample=False)

    model.to("tpu")
    result: dict = {"side": side}

    place = (lambda ids: ids.to(model.device)) if how["inputs_on_tpu"] else (lambda ids: ids)

    # Scenario: one prompt, three identical calls.
    runs = []
    for _ in range(3):
        before, start = sim.counters(), time.perf_counter()
        out = model.generate(place(single), max_new_tokens=cfg["tpu_new"], do_sample=False, **extra)
        delta, wall = sim.counters() - before, time.perf_counter() - start
        new_tokens = out.shape[1] - single.shape[1]
        runs.append({
            "programs": delta.programs,
            "graphs": delta.graphs_compiled,
            "eager_programs": delta.eager_programs,
            "new_tokens": new_tokens,
            "programs_per_token": round(delta.programs / max(new_tokens, 1), 3),
            "h2d_bytes_per_token": round(delta.h2d_bytes / max(new_tokens, 1), 1),
            "d2h_bytes_per_token": round(delta.d2h_bytes / max(new_tokens, 1), 1),
            "wall_s": round(wall, 3),
            "output_device": str(out.device),
            "tokens_match_cpu": bool(torch.equal(out.cpu(), single_ref)),
        })
    result["tpu_inputs"] = {
        "first_call": runs[0],
        "later_calls": runs[1:],
        "new_programs_per_token_after_first_call": max(r["programs_per_token"] for r in runs[1:]),
        "decode_compiled": any(r["graphs"] > 0 for r in runs),
        "tokens_match_cpu": all(r["tokens_match_cpu"] for r in runs),
        "output_on_input_device": all(r["output_device"].startswith("tpu" if how["inputs_on_tpu"] else "cpu") for r in runs),
    }

    # Scenario: the mixed workload.
    warm = {}
    if side == "plugin_warmup":
        import transformers_tpu_ext

        before, start = sim.counters(), time.perf_counter()
        plans = transformers_tpu_ext.warmup(
            model,
            max_batch_size=max(b for b, _, _ in workload),
            max_prompt_length=max(p for _, p, _ in workload),
            max_new_tokens=max(n for _, _, n in workload),
        )
        delta = sim.counters() - before
        warm = {"shapes": len(plans), "programs": delta.programs, "wall_s": round(time.perf_counter() - start, 3)}
    per_call, matches, padding, attention = [], [], [], []
    plan_of = _planner(side)
    start_all = time.perf_counter()
    for ids, (batch, length, new), ref in zip(prompts, workload, reference):
        before, start = sim.counters(), time.perf_counter()
        out = model.generate(place(ids), max_new_tokens=new, do_sample=False, **extra)
        delta, wall = sim.counters() - before, time.perf_counter() - start
        made = out.shape[1] - length
        per_call.append((delta, made * batch, wall))
        matches.append(bool(torch.equal(out.cpu(), ref)))
        padded_batch, padded_prompt = plan_of(batch, length)
        padding.append((batch, length, made, padded_batch, padded_prompt))
        # A static cache is as long as the longest made for this model so far: Transformers keeps that
        # length in _previous_max_cache_length, the plugin its own (static_cache.FLOOR), leaving
        # Transformers' attribute as it would be without the plugin (issue 18, item 6).
        static = side != "plain"
        longest = getattr(model, "_tpu_ext_cache_floor", None) or getattr(model, "_previous_max_cache_length", None)
        attention.append((batch, length, made, padded_batch, longest if static else None))
    total_wall = time.perf_counter() - start_all
    half = len(per_call) // 2
    first = sum((d for d, _, _ in per_call[:half]), type(per_call[0][0])())
    second = sum((d for d, _, _ in per_call[half:]), type(per_call[0][0])())
    total = first + second
    tokens = sum(t for _, t, _ in per_call)
    from transformers_tpu_ext.generation.buckets import attention_overhead, padding_overhead

    result["mixed"] = {
        "calls": len(workload),
        "warmup": warm or None,
        "programs_total": total.programs,
        "graphs_total": total.graphs_compiled,
        "eager_programs_total": total.eager_programs,
        "programs_first_half": first.programs,
        "programs_second_half": second.programs,
        "second_half_growth_pct": round(100 * second.programs / first.programs, 1) if first.programs else 0.0,
        "generated_tokens": tokens,
        "h2d_bytes_per_token": round(total.h2d_bytes / tokens, 1),
        "d2h_bytes_per_token": round(total.d2h_bytes / tokens, 1),
        "wall_s": round(total_wall, 2),
        "padding_overhead": round(padding_overhead(padding), 3),
        "attention_overhead": round(attention_overhead(attention), 3),
        "tokens_match_cpu": all(matches),
        "calls_matching_cpu": sum(matches),
    }
    result["decode_bytes"] = decode_bytes(sim, side, quick)
    result["prefill_bytes"] = prefill_bytes(sim, model, place, extra, quick)

    # Sampling with a seed stays reproducible.
    outs = []
    for _ in range(2):
        torch.manual_seed(7)
        outs.append(model.generate(place(prompts[0]), max_new_tokens=8, do_sample=True, top_k=20, **extra).cpu())
    result["sampling_reproducible"] = bool(torch.equal(outs[0], outs[1]))
    return result


def decode_bytes(sim, side: str, quick: bool) -> dict:
    """Bytes TPU->host and host->TPU per row and decode step in steady state (vocabulary 32,000).

    The difference between calls making ``long`` and ``short`` new tokens (both forced to their full
    length) divided by the extra steps and rows: what one more decode step costs, prefill excluded.
    """
    import torch

    from transformers_tpu_ext.testing.tiny import tiny_model

    model = tiny_model("qwen3", seed=0, vocab_size=32000).to("tpu")
    extra = SIDES[side]["kwargs"]
    gen = torch.Generator().manual_seed(5)
    short, long = (4, 8) if quick else (8, 24)
    report = {}
    for batch in (1,) if quick else (1, 8):
        for where in ("cpu", "tpu"):
            prompt = torch.randint(2, 32000, (batch, 10), generator=gen).to(where)
            modes = (
                ("greedy", {"do_sample": False}),
                ("sample", {"do_sample": True, "top_k": 50, "top_p": 0.9, "temperature": 0.7}),
                ("host_loop", {"do_sample": False, "repetition_penalty": 1.3}),
            )
            for mode, kwargs in modes:
                counts = {}
                for new in (short, long):
                    model.generate(prompt, max_new_tokens=new, min_new_tokens=new, **kwargs, **extra)
                    before = sim.counters()
                    model.generate(prompt, max_new_tokens=new, min_new_tokens=new, **kwargs, **extra)
                    counts[new] = sim.counters() - before
                delta, steps = counts[long] - counts[short], (long - short) * batch
                report[f"batch{batch}/inputs_{where}/{mode}"] = {
                    "d2h_bytes_per_row_step": round(delta.d2h_bytes / steps, 1),
                    "h2d_bytes_per_row_step": round(delta.h2d_bytes / steps, 1),
                    "new_programs": delta.programs,
                }
    return report


def prefill_bytes(sim, model, place, extra: dict, quick: bool) -> dict:
    """Bytes host->TPU and TPU->host of one prefill in steady state: a one-token call (the prefill
    chooses it), the second of two identical calls, so nothing compiles and nothing is first-time."""
    import torch

    gen = torch.Generator().manual_seed(9)
    report = {}
    cases = {"batch4_prompt12": (4, 12)} if quick else {"batch4_prompt12": (4, 12), "batch2_prompt150": (2, 150)}
    for name, (batch, length) in cases.items():
        ids = torch.randint(2, model.config.vocab_size, (batch, length), generator=gen)
        mask = torch.ones_like(ids)
        mask[1:, : length // 4] = 0  # a ragged batch, left-padded as a tokenizer pads it
        for _ in range(2):
            before = sim.counters()
            model.generate(place(ids), attention_mask=place(mask), max_new_tokens=1, do_sample=False, **extra)
            delta = sim.counters() - before
        report[name] = {"h2d_bytes": delta.h2d_bytes, "d2h_bytes": delta.d2h_bytes, "new_programs": delta.programs}
    return report


def _planner(side: str):
    """``(batch, prompt) -> (padded batch, padded prompt)`` for the side's policy."""
    if not SIDES[side]["plugin"]:
        return lambda batch, length: (batch, length)
    from transformers_tpu_ext.generation import config as generation_config

    settings = generation_config.current()
    # the workload's prompts have no padding: the patch reserves one padding column for them
    return lambda batch, length: tuple(settings.plan(batch, length, 1, min_padding=1)[:2])


def cpu_overhead(runs: int) -> dict:
    """One small generate() on CPU (no TPU): plugin active vs deactivated, same process, interleaved."""
    import torch

    import transformers_tpu_ext
    from transformers_tpu_ext.testing.tiny import tiny_model

    model = tiny_model("qwen3", seed=0)
    ids = torch.randint(2, model.config.vocab_size, (1, 8), generator=torch.Generator().manual_seed(0))
    timings = {"on": [], "off": []}
    outputs = {}
    import gc

    model.generate(ids, max_new_tokens=4, do_sample=False)  # warm caches
    block = 10  # alternate blocks of calls, so toggling the plugin is never inside a timed call
    for _ in range(max(runs // block, 1)):
        for state in ("on", "off"):
            (transformers_tpu_ext.activate if state == "on" else transformers_tpu_ext.deactivate)()
            gc.collect()
            for _ in range(block):
                start = time.perf_counter()
                outputs[state] = model.generate(ids, max_new_tokens=4, do_sample=False)
                timings[state].append(time.perf_counter() - start)
    transformers_tpu_ext.activate()
    return {**_compare(timings["on"], timings["off"], digits=3), "same_tokens": bool(torch.equal(outputs["on"], outputs["off"]))}


def _compare(with_plugin: list[float], without: list[float], digits: int) -> dict:
    """Medians and minima in ms; the overhead is taken on the minima (the least disturbed by load)."""
    ms = lambda seconds: round(seconds * 1e3, digits)  # noqa: E731
    return {
        "median_ms_with_plugin": ms(statistics.median(with_plugin)),
        "median_ms_without_plugin": ms(statistics.median(without)),
        "min_ms_with_plugin": ms(min(with_plugin)),
        "min_ms_without_plugin": ms(min(without)),
        "overhead_ms": ms(min(with_plugin) - min(without)),
        "runs": len(with_plugin),
    }


# -------------------------------------------------------------------------------------------------
# Parent side


_env = worker_env


def _run_worker(args: list[str], env: dict) -> dict:
    return run_worker(__file__, args, env)


def import_overhead(runs: int) -> dict:
    """Median wall time of ``import torch`` in fresh interpreters, with and without the plugin's entry point."""
    code = "import time; t = time.perf_counter(); import torch; print(time.perf_counter() - t)"
    times = {"with_plugin": [], "without_plugin": []}
    for _ in range(runs):
        for name, env in (
            ("with_plugin", _env()),
            ("without_plugin", _env(TORCH_DEVICE_BACKEND_AUTOLOAD="0")),
        ):
            out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
            times[name].append(float(out.stdout.strip().splitlines()[-1]))
    return _compare(times["with_plugin"], times["without_plugin"], digits=1)


def prior_art(quick: bool) -> dict:
    """Bucket policies on the same workload: distinct prefill shapes and padding overhead."""
    from transformers_tpu_ext import ladders
    from transformers_tpu_ext.generation import buckets
    from transformers_tpu_ext.generation import config as generation_config

    cfg = sizes(quick)
    workload = mixed_workload(cfg["calls"], cfg["max_prompt"], cfg["max_new"])
    ours = generation_config.current()
    pow2 = ladders.geometric_ladder(1, 1 << 20, 1, 1)
    policies = {
        # vLLM TPU: token counts padded to powers of two, minimum bucket 16.
        "pow2_min16 (vLLM TPU)": lambda b, p: (ladders.round_up(b, pow2), ladders.round_up(max(p, 16), pow2), None),
        # optimum-habana: prompt padded to a multiple of bucket_size (128 in its examples).
        "linear_128 (optimum-habana)": lambda b, p: (ladders.round_up(b, pow2), ladders.round_up(p, range(128, 1 << 16, 128)), None),
        "ours": lambda b, p: (lambda plan: (plan.batch, plan.prompt, plan.chunk))(ours.plan(b, p, 1, min_padding=1)),
    }
    report = {}
    for name, policy in policies.items():
        shapes, calls = set(), []
        for batch, length, new in workload:
            padded_batch, padded_prompt, chunk = policy(batch, length)
            chunk = chunk or padded_prompt
            # upstream's chunked prefill: whole chunks from the left, then the remainder
            pieces = {chunk} | ({padded_prompt % chunk} if padded_prompt % chunk else set())
            shapes.update((padded_batch, piece) for piece in pieces)
            calls.append((batch, length, new, padded_batch, padded_prompt))
        bound = {}
        for longest in (cfg["max_prompt"], 4096):  # every prompt length up to `longest`, batch 1
            pieces = set()
            for length in range(1, longest + 1):
                _, padded, chunk = policy(1, length)
                chunk = chunk or padded
                pieces |= {chunk} | ({padded % chunk} if padded % chunk else set())
            bound[f"prompts_up_to_{longest}"] = len(pieces)
        report[name] = {
            "prefill_shapes_in_workload": len(shapes),
            "padding_overhead": round(buckets.padding_overhead(calls), 3),
            "prefill_shapes_per_batch_bucket": bound,
        }
    return report


def _family_module(family: str):
    """The module that runs ``family``'s 12 mixed calls (``FAMILIES``, ``SIDES``, ``worker``): a vision-language or
    speech family (``_families.py``), or a state-space or hybrid one (``_recurrent_families.py``)."""
    import _families
    import _recurrent_families

    for module in (_families, _recurrent_families):
        if family in module.FAMILIES:
            return module
    known = (*_families.FAMILIES, *_recurrent_families.FAMILIES)
    raise SystemExit(f"unknown family {family!r}; choose from {', '.join(known)}")


def _families_main(args: argparse.Namespace) -> int:
    """``--family``: each family's sides (its module's ``SIDES``), each in its own interpreter."""
    calls = 6 if args.quick else 12
    if args.family_side:
        emit(_family_module(args.family).worker(args.family, args.family_side, calls))
        return 0
    started = time.perf_counter()
    report: dict = {"quick": args.quick, "calls": calls}
    for family in args.family.split(","):
        module = _family_module(family)
        sides = [s for s in args.sides.split(",") if s in module.SIDES] or list(module.SIDES)
        report[family] = {}
        for side in sides:
            env = _env(TRANSFORMERS_TPU_EXT_DISABLE="1") if side in ("plain", "guide") else _env()
            try:
                report[family][side] = _run_worker(["--family", family, "--family-side", side, *(["--quick"] if args.quick else [])], env)
            except RuntimeError as error:  # a side that fails (plain Transformers on the chip, say) is reported as such
                lines = [line for line in str(error).splitlines() if line.strip()]
                report[family][side] = {"error": lines[-1][:500] if lines else str(error)[:500]}
    report["bench_wall_s"] = round(time.perf_counter() - started, 1)
    write_report(report, args.output)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small smoke run")
    parser.add_argument("--output", help="also write the JSON to this file (e.g. benchmarks/results/run.json)")
    parser.add_argument("--sides", default="plain,guide,plugin,plugin_warmup", help="comma list of sides to run")
    parser.add_argument("--no-overhead", action="store_true", help="skip the import/CPU overhead measures")
    parser.add_argument("--family", help="a family's 12 mixed calls instead (comma list): vision-language or speech "
                        "(llava, gemma3, qwen2_vl, qwen2_5_vl, qwen3_vl, whisper), state-space or hybrid "
                        "(mamba, mamba2, jamba, falcon_h1, lfm2, qwen3_next)")
    parser.add_argument("--family-side", help=argparse.SUPPRESS)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--cpu-overhead", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    quick_flag = ["--quick"] if args.quick else []

    if args.family:
        return _families_main(args)
    if args.worker:
        emit(worker(args.worker, args.quick))
        return 0
    if args.cpu_overhead:
        emit(cpu_overhead(sizes(args.quick)["cpu_runs"]))
        return 0

    started = time.perf_counter()
    report: dict = {"quick": args.quick, "workload": dict(zip(("calls", "max_prompt", "max_new"), list(sizes(args.quick).values())[:3]))}
    for side in args.sides.split(","):
        if side not in SIDES:
            parser.error(f"unknown side {side!r}; choose from {', '.join(SIDES)}")
        env = _env() if SIDES[side]["plugin"] else _env(TRANSFORMERS_TPU_EXT_DISABLE="1")
        report[side] = _run_worker(["--worker", side, *quick_flag], env)
    if "plugin" in report:
        ours = report["plugin"]["mixed"]["programs_total"]
        report["comparison"] = {
            f"mixed_programs_{base}_over_plugin": round(report[base]["mixed"]["programs_total"] / max(ours, 1), 1)
            for base in ("plain", "guide")
            if base in report
        }
    if not args.no_overhead:
        report["overhead"] = {
            "import_torch": import_overhead(sizes(args.quick)["import_runs"]),
            "generate_cpu_no_tpu": _run_worker(["--cpu-overhead", *quick_flag], _env()),
        }
    report["bucket_policies"] = prior_art(args.quick)
    report["bench_wall_s"] = round(time.perf_counter() - started, 1)
    write_report(report, args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
