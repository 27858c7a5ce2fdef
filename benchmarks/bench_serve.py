"""Continuous batching on the simulated TPU, with and without transformers-tpu-ext, in one run.

    python benchmarks/bench_serve.py            # full run: 100 requests (several minutes on 2 cores)
    python benchmarks/bench_serve.py --quick    # smoke run (tests/test_benchmark_serve.py runs it)
    python benchmarks/bench_serve.py --output benchmarks/results/serve.json

Each side runs in its own subprocess (patches are process-global): ``baseline`` is plain
Transformers 5.24 (``TRANSFORMERS_TPU_EXT_DISABLE=1``), ``plugin`` is transformers-tpu-ext with its
defaults. Both build the same seeded tiny Qwen3-shaped model, compute every request's reference
tokens with a per-request greedy ``generate()`` on the CPU, move the model to the simulated ``tpu``,
start a ``ContinuousBatchingManager`` and stream the workload through it: requests with prompt
lengths 1..300 and ``max_new_tokens`` 1..64 in mixed order, ``in_flight`` of them at a time (a
finished request lets the next one in).

The baseline is what a user of plain Transformers gets: eager steps (no compile config; a default
compile level picks inductor, which fails on TPU: the ``compile_probe``), and a cache it would size
from host RAM, so it is given an explicit ``num_blocks`` to run at all (``would_size_cache_from``
reports the memory it would have used).
"""

from __future__ import annotations

import argparse
import random
import sys
import time

from _common import emit, run_worker, worker_env, write_report



#: HBM bandwidth per chip generation, bytes/s (Google Cloud's published figures).
HBM_BANDWIDTH = {"v5e": 819e9, "v6e": 1638e9, "v5p": 2765e9, "TPU7x": 7380e9}


def roofline(stats: dict, layers: int, weight_bytes: int) -> dict:
    """Decode tokens/s a chip generation reaches if a decode step takes the time to read the weights and
    the K/V its attention reads from HBM (the bound of a memory-bound step), from the plan's step stats:
    for the attention that ran, for JAX's ragged paged attention kernel on the same steps, and for the
    floor (only the K/V the requests hold)."""
    steps = stats.get("decode_steps") or 0
    if not steps:
        return {}
    tokens = stats["decode_tokens"] / steps
    per_step = {
        "attention_that_ran": stats["decode_kv_bytes_read"] * layers / steps,
        "kernel": stats["decode_kernel_kv_bytes"] * layers / steps,
        "held": stats["decode_kv_bytes_held"] * layers / steps,
    }
    return {
        "decode_tokens_per_step": round(tokens, 2),
        "weight_bytes": weight_bytes,
        "kv_bytes_per_decode_step": {k: int(v) for k, v in per_step.items()},
        "tokens_per_second": {
            chip: {k: round(tokens * bw / (weight_bytes + v), 1) for k, v in per_step.items()} for chip, bw in HBM_BANDWIDTH.items()
        },
    }


def decode_floor(requests: int = 64, lengths: tuple[int, int] = (16, 1000), seed: int = 0) -> dict:
    """The issue's decode step, counted (no model runs): ``requests`` requests holding 16..1,000 tokens
    each, a Llama-3-8B shape (32 layers, 8 key-value heads of 128, bf16, 16.06 GB of weights), at the
    default max length (2048, pages of 128). K/V bytes read per step by the kernel (the pages of each
    request) and by the plain-PyTorch gather (``max_len`` keys per token), and the roofline tokens/s of
    each chip generation."""
    from transformers_tpu_ext.serving import kernel_path
    from transformers_tpu_ext.serving import policy as serving

    rng = random.Random(seed)
    lens = [rng.randint(*lengths) for _ in range(requests)]
    layers, per_token, weights = 32, 2 * 8 * 128 * 2, 16_060_000_000
    page = serving.page_size_for(serving.DEFAULT_MAX_LEN)
    keys = serving.blocks_per_request(serving.DEFAULT_MAX_LEN, page) * page
    padded = serving.round_up(requests, serving.token_ladder(serving.DEFAULT_MAX_BATCH_TOKENS))
    per_step = {
        "held": kernel_path.held_kv_bytes(lens, per_token) * layers,
        "kernel": kernel_path.kernel_kv_bytes(lens, page, per_token) * layers,
        "gather": kernel_path.gathered_kv_bytes(padded, keys, per_token) * layers,
    }
    return {
        "requests": requests,
        "tokens_held": [min(lens), max(lens), sum(lens)],
        "kv_bytes_per_decode_step": per_step,
        "read_over_held": {k: round(v / per_step["held"], 3) for k, v in per_step.items() if k != "held"},
        "tokens_per_second": {
            chip: {k: round(requests * bw / (weights + v), 1) for k, v in per_step.items()} for chip, bw in HBM_BANDWIDTH.items()
        },
    }


#: vLLM TPU's published serving figure whose model and chip the roofline below matches (issue 26):
#: Llama-3.3-70B on a v6e-8 slice, 1,024 tokens in and 1,024 out, 64 requests at a time.
VLLM_TPU_PUBLISHED = {
    "model": "Llama-3.3-70B", "chip": "v6e", "chips": 8, "input_tokens": 1024, "output_tokens": 1024,
    "concurrency": 64, "output_tokens_per_second": 2495,
}

#: Llama-3.3-70B's shape: 80 layers, 8 key-value heads of 128, 70.55e9 parameters in bf16.
LLAMA_3_70B = {"layers": 80, "kv_heads": 8, "head_dim": 128, "weight_bytes": 141_100_000_000}

#: Share of HBM bandwidth vLLM TPU reports reaching in decode (arXiv 2604.15464).
DECODE_BANDWIDTH_SHARE = 0.86


def published_comparison(published: dict = VLLM_TPU_PUBLISHED, shape: dict = LLAMA_3_70B) -> dict:
    """The roofline of ``published``'s workload next to its measured figure, counted (no model runs).

    Tensor parallel over ``chips`` chips: each chip reads its share of the weights and the K/V of
    its key-value heads at every decode step. In steady state the ``concurrency`` requests are
    spread evenly over their output, so they hold ``input`` to ``input + output`` tokens. The step
    time is the bytes one chip reads over its HBM bandwidth (all-reduces over ICI and the prefill of
    new requests are not counted, so the roofline is an upper bound of what any server reaches)."""
    from transformers_tpu_ext.serving import kernel_path
    from transformers_tpu_ext.serving import policy as serving

    chips, requests = published["chips"], published["concurrency"]
    max_len = published["input_tokens"] + published["output_tokens"]
    lens = [published["input_tokens"] + (i * published["output_tokens"]) // requests + 1 for i in range(requests)]
    kv_heads = max(1, shape["kv_heads"] // chips)
    per_token = 2 * kv_heads * shape["head_dim"] * 2  # keys and values, bf16, one layer, one chip
    page = serving.page_size_for(max_len)
    keys = serving.blocks_per_request(max_len, page) * page
    padded = serving.round_up(requests, serving.token_ladder(serving.DEFAULT_MAX_BATCH_TOKENS))
    per_step = {
        "held": kernel_path.held_kv_bytes(lens, per_token) * shape["layers"],
        "kernel": kernel_path.kernel_kv_bytes(lens, page, per_token) * shape["layers"],
        "gather": kernel_path.gathered_kv_bytes(padded, keys, per_token) * shape["layers"],
    }
    weights = shape["weight_bytes"] / chips
    bandwidth = HBM_BANDWIDTH[published["chip"]]
    roof = {k: round(requests * bandwidth / (weights + v), 1) for k, v in per_step.items()}
    measured = published["output_tokens_per_second"]
    return {
        "published": dict(published),
        "per_chip": {"weight_bytes": int(weights), "kv_bytes_per_decode_step": per_step},
        "roofline_tokens_per_second": roof,
        "at_decode_bandwidth_share": {k: round(v * DECODE_BANDWIDTH_SHARE, 1) for k, v in roof.items()},
        "published_over_kernel_roofline": round(measured / roof["kernel"], 3),
    }


def workload(requests: int, max_prompt: int, max_new: int, seed: int = 0) -> list[tuple[int, int]]:
    """``requests`` deterministic ``(prompt_length, max_new_tokens)`` pairs, in mixed order."""
    rng = random.Random(seed)
    return [(rng.randint(1, max_prompt), rng.randint(1, max_new)) for _ in range(requests)]


def sizes(quick: bool) -> dict:
    if quick:
        return {"requests": 12, "max_prompt": 40, "max_new": 8, "in_flight": 6, "hbm": "96MiB",
                "serve_env": {"TRANSFORMERS_TPU_EXT_SERVE_MAX_BATCH_TOKENS": "32", "TRANSFORMERS_TPU_EXT_SERVE_MAX_REQUESTS": "8"}}
    return {"requests": 100, "max_prompt": 300, "max_new": 64, "in_flight": 24, "hbm": "512MiB", "serve_env": {}}


# -------------------------------------------------------------------------------------------------
# Worker side (one process per side)


#: Models of each head size the floor is counted for: layers, key-value heads, head size, bf16 weight bytes.
FLOOR_MODELS = {
    "head_dim 64 (Llama 3.2 1B)": (16, 8, 64, 2_470_000_000),
    "head_dim 128 (Llama 3 8B)": (32, 8, 128, 16_060_000_000),
}


def decode_floor_formats(requests: int = 64, lengths: tuple[int, int] = (16, 1000), seed: int = 0) -> dict:
    """:func:`decode_floor` for head sizes 64 and 128, bf16 and int8 pages (counted, no model runs): K/V
    bytes read per decode step by the kernel (head size 64 lane-packed: the same bytes as held, rounded
    to pages) and by the gather, against the bytes held, and the roofline tokens/s per chip generation.
    int8 pages: one byte per value (the kernel's scales, per layer and head, are negligible; the gather's
    per-position float32 scales are counted)."""
    from transformers_tpu_ext.serving import kernel_path
    from transformers_tpu_ext.serving import policy as serving

    rng = random.Random(seed)
    lens = [rng.randint(*lengths) for _ in range(requests)]
    page = serving.page_size_for(serving.DEFAULT_MAX_LEN)
    keys = serving.blocks_per_request(serving.DEFAULT_MAX_LEN, page) * page
    padded = serving.round_up(requests, serving.token_ladder(serving.DEFAULT_MAX_BATCH_TOKENS))
    out = {}
    for name, (layers, kv_heads, head_dim, weights) in FLOOR_MODELS.items():
        for pages, itemsize, scale_bytes in (("bf16", 2, 0), ("int8", 1, 4)):
            per_token = 2 * kv_heads * head_dim * itemsize
            per_step = {
                "held": kernel_path.held_kv_bytes(lens, per_token) * layers,
                "kernel": kernel_path.kernel_kv_bytes(lens, page, per_token) * layers,
                "gather": kernel_path.gathered_kv_bytes(padded, keys, per_token + 2 * kv_heads * scale_bytes) * layers,
            }
            out[f"{name}, {pages} pages"] = {
                "lane_packing": kernel_path.lane_packing(head_dim, kv_heads),
                "kv_bytes_per_decode_step": per_step,
                "read_over_held": {k: round(v / per_step["held"], 3) for k, v in per_step.items() if k != "held"},
                "tokens_per_second": {
                    chip: {k: round(requests * bw / (weights + v), 1) for k, v in per_step.items()}
                    for chip, bw in HBM_BANDWIDTH.items()
                },
            }
    return out


def _side(side: str) -> tuple[str, int, str | None]:
    """``plugin``, ``baseline`` or ``plugin-hd64-int8``: the side, the head size (8: the tiny default) and
    the KV cache format of a run."""
    parts = side.split("-")
    head_dim = next((int(p[2:]) for p in parts[1:] if p.startswith("hd")), 0)
    kv = "int8" if "int8" in parts[1:] else None
    return parts[0], head_dim, kv


def worker(side: str, quick: bool) -> dict:
    import torch
    from transformers import ContinuousBatchingConfig, GenerationConfig

    from transformers_tpu_ext import testing
    from transformers_tpu_ext.testing.tiny import check_context_sensitive, tiny_model

    cfg = sizes(quick)
    label, head_dim, kv_cache = _side(side)
    side = label
    sim = testing.install(chips=1, hbm_bytes=cfg["hbm"])
    shape = dict(head_dim=head_dim, num_attention_heads=8, num_key_value_heads=4) if head_dim else {}
    model = tiny_model("qwen3", seed=0, **shape)
    if kv_cache:
        from transformers_tpu_ext import serving

        serving.configure(kv_cache=kv_cache)
    check_context_sensitive(model)
    gen = torch.Generator().manual_seed(1234)
    work = workload(cfg["requests"], cfg["max_prompt"], cfg["max_new"])
    prompts = [torch.randint(2, model.config.vocab_size, (n,), generator=gen).tolist() for n, _ in work]
    reference = [
        model.generate(torch.tensor([p]), max_new_tokens=n, min_new_tokens=n, do_sample=False)[0, len(p):].tolist()
        for p, (_, n) in zip(prompts, work)
    ]
    model.to("tpu")
    gc = GenerationConfig(do_sample=False, eos_token_id=1, pad_token_id=0)
    result: dict = {"side": side, "head_dim": model.config.head_dim, "kv_cache": kv_cache}
    if side == "baseline":
        result["would_size_cache_from"] = _upstream_available_memory()
        result["compile_probe"] = _compile_probe(model, gc, prompts[:2])
        cb_config = ContinuousBatchingConfig(num_blocks=64)
    else:
        cb_config = None

    start = time.perf_counter()
    before = sim.counters()
    manager = model.init_continuous_batching(generation_config=gc, continuous_batching_config=cb_config)
    manager.warmup()
    warm = sim.counters() - before
    result["warmup_seconds"] = round(time.perf_counter() - start, 2)
    manager.start()

    start = time.perf_counter()
    before = sim.counters()
    halfway = None
    outputs: dict[str, list[int]] = {}
    ids: list[str] = []
    pending = list(range(len(work)))
    in_flight = 0
    while len(outputs) < len(work):
        while pending and in_flight < cfg["in_flight"]:
            i = pending.pop(0)
            ids.append(manager.add_request(prompts[i], request_id=f"r{i}", max_new_tokens=work[i][1]))
            in_flight += 1
        # JAX's kernel runs as its reference on the simulated TPU, compiling an XLA program per new shape: a step
        # of the kernel sides can take minutes on a loaded machine
        out = manager.get_result(timeout=900 if head_dim else 120)
        if out is None:
            raise RuntimeError("the manager stopped answering")
        if out.is_finished():
            if out.error:
                raise RuntimeError(out.error)
            outputs[out.request_id] = out.generated_tokens
            in_flight -= 1
            if len(outputs) == len(work) // 2:
                halfway = sim.counters() - before
    stream = sim.counters() - before
    stream_seconds = time.perf_counter() - start
    processor = manager.batch_processor
    cache_tensor = processor.cache.cache_tensor
    plan = getattr(manager.continuous_batching_config, "tpu_plan", None)
    manager.stop(block=True)
    manager.destroy()

    generated = sum(len(v) for v in outputs.values())
    props = torch.tpu.get_device_properties()
    result.update(
        tokens_match_cpu=[outputs[f"r{i}"] for i in range(len(work))] == reference,
        requests=len(work),
        generated_tokens=generated,
        warmup=warm.asdict(),
        stream=stream.asdict(),
        programs_after_warmup=stream.programs,
        programs_total=warm.programs + stream.programs,
        programs_first_half=halfway.programs if halfway else None,
        programs_second_half=stream.programs - halfway.programs if halfway else None,
        stream_seconds=round(stream_seconds, 2),
        tokens_per_second=round(generated / stream_seconds, 1),
        hbm_bytes=props.total_memory,
        kv_cache_bytes=cache_tensor.numel() * cache_tensor.element_size(),
        compile_backend=getattr(manager.continuous_batching_config.varlen_compile_config, "backend", None),
    )
    if plan is not None:
        info = plan.asdict()
        result["plan"] = {k: v for k, v in info.items() if k != "stats"}
        result["steps"] = info["stats"]
        result["padding_overhead"] = info["stats"]["token_overhead"]
        result["kv_cache_fraction_of_budget"] = info["kv_cache_fraction_of_budget"]
        result["kv_cache_within_budget"] = info["kv_cache_bytes"] + info["step_bytes"] <= info["kv_budget_bytes"]
        result["kv_read_over_held"] = {
            "decode_steps": info["stats"]["decode_steps"],
            "attention": info["attention"],
            "attention_that_ran": info["stats"]["decode_kv_read_over_held"],
            "kernel_on_the_same_steps": info["stats"]["decode_kernel_kv_read_over_held"],
        }
        result["roofline"] = roofline(info["stats"], model.config.num_hidden_layers, info["resident_bytes"])
    else:
        result["padding_overhead"] = 1.0  # upstream pads nothing when it does not compile
    return result


def _upstream_available_memory() -> dict:
    """What plain Transformers sizes its paged cache from on a TPU host: host RAM (its CPU branch)."""
    from transformers.generation.continuous_batching.utils import get_device_and_memory_breakdown

    device, total, reserved, allocated = get_device_and_memory_breakdown()
    return {"device_branch": str(device), "total_bytes": total, "available_bytes_at_0.9": int((total - max(allocated, reserved)) * 0.9)}


def _compile_probe(model, gc, prompts) -> dict:
    """Plain Transformers with a compile level: its default CompileConfig is inductor."""
    from transformers import ContinuousBatchingConfig

    config = ContinuousBatchingConfig(num_blocks=16, default_compile_level=1)
    out = model.generate_batch(prompts, generation_config=gc, max_new_tokens=2, continuous_batching_config=config)
    errors = [o.error for o in out.values() if o.error]
    return {"requests_failed": len(errors), "requests": len(prompts), "error": (errors[0] or "")[:160] if errors else None}


# -------------------------------------------------------------------------------------------------
# Driver side


def _run_worker(side: str, quick: bool) -> dict:
    env = worker_env(**sizes(quick)["serve_env"], TRANSFORMERS_TPU_EXT_DISABLE="1" if side == "baseline" else None)
    return run_worker(__file__, ["--worker", side] + (["--quick"] if quick else []), env)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small smoke run")
    parser.add_argument(
        "--sides", default="baseline,plugin",
        help="comma list of sides to run: baseline, plugin, and plugin-hd64, plugin-hd128-int8... (JAX's kernel "
             "where JAX is installed; 8 query and 4 key-value heads of that size; int8 pages)",
    )
    parser.add_argument("--output", help="also write the JSON report to this file")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        emit(worker(args.worker, args.quick))
        return 0
    cfg = sizes(args.quick)
    work = workload(cfg["requests"], cfg["max_prompt"], cfg["max_new"])
    report: dict = {
        "decode_floor": decode_floor(),
        "decode_floor_formats": decode_floor_formats(),
        "published_comparison": published_comparison(),
        "workload": {
            "requests": len(work),
            "prompt_lengths": [min(p for p, _ in work), max(p for p, _ in work)],
            "max_new_tokens": [min(n for _, n in work), max(n for _, n in work)],
            "in_flight": cfg["in_flight"],
            "simulated_hbm": cfg["hbm"],
        }
    }
    for side in args.sides.split(","):
        report[side] = _run_worker(side, args.quick)
    if "baseline" in report and "plugin" in report:
        base, plug = report["baseline"], report["plugin"]
        report["comparison"] = {
            "programs_after_warmup": [base["programs_after_warmup"], plug["programs_after_warmup"]],
            "programs_total": [base["programs_total"], plug["programs_total"]],
            "tokens_match_cpu": [base["tokens_match_cpu"], plug["tokens_match_cpu"]],
            "padding_overhead": [base["padding_overhead"], plug["padding_overhead"]],
            "stream_seconds": [base["stream_seconds"], plug["stream_seconds"]],
        }
    formats = {side: report[side] for side in args.sides.split(",") if "-hd" in side}
    if formats:  # K/V bytes read over held per decode step, and programs after the warm-up, per head size and pages
        report["formats"] = {
            side: {
                "attention": got.get("kv_read_over_held", {}).get("attention"),
                "tokens_match_cpu": got["tokens_match_cpu"],
                "programs_after_warmup": got["programs_after_warmup"],
                "decode_kv_read_over_held": got.get("kv_read_over_held", {}).get("attention_that_ran"),
                "kv_bytes_per_decode_step": got.get("roofline", {}).get("kv_bytes_per_decode_step"),
            }
            for side, got in formats.items()
        }
    write_report(report, args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
