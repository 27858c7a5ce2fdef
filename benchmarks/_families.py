"""``bench_generate.py --family``: 12 mixed ``generate()`` calls of a vision-language or speech family.

Each side runs in its own interpreter: ``plain`` (Transformers without the plugin, inputs on the TPU, no cache
argument), ``plugin`` (the same code with the plugin) and ``plugin_warmup`` (``transformers_tpu_ext.warmup()`` first,
then every call in torch_tpu's cache-only mode: a program the process does not hold fails the call). The
workload: for a vision-language family (``testing.tiny_vlm``), batches of 1 or 2 prompts of 3 to about 40 text
tokens, two of every three calls with one image a prompt (two sizes in turn), 4 to 8 new tokens; for Whisper
(``testing.tiny_media.tiny_whisper_generation``), batches of 1 or 2 clips of random lengths (0.1 to 1 s, the
feature extractor pads them), 4 to 8 new tokens. Greedy; tokens compared with the CPU's.
"""

from __future__ import annotations

import random
import time

VLM = ("llava", "gemma3", "qwen2_vl", "qwen2_5_vl", "qwen3_vl")
FAMILIES = (*VLM, "whisper")
SIDES = ("plain", "plugin", "plugin_warmup")


def _calls(family: str, calls: int):
    """``(model, [(inputs, max_new_tokens)], warmup kwargs)`` on the CPU."""
    if family == "whisper":
        from transformers_tpu_ext.testing import tiny_media

        model, extractor = tiny_media.tiny_whisper_generation()
        rng = random.Random(0)
        audio = tiny_media.clips(2 * calls, shortest=1600, longest=16000)
        work, start = [], 0
        for _ in range(calls):
            batch = rng.choice((1, 2))
            features = extractor(audio[start:start + batch], sampling_rate=16000, return_tensors="pt")
            start += batch
            work.append(({"input_features": features["input_features"]}, rng.randint(4, 8)))
        return model, work, dict(max_prompt_length=1, max_new_tokens=8, batch_sizes=[1, 2])
    from transformers_tpu_ext.testing import tiny_vlm

    model, processor = tiny_vlm.tiny_vlm(family)
    requests = tiny_vlm.vlm_requests(family, calls)
    work = [(tiny_vlm.processed(processor, r), r.new_tokens) for r in requests]
    longest = max(inputs["input_ids"].shape[1] for inputs, _ in work)
    return model, work, dict(max_prompt_length=longest, max_new_tokens=8, batch_sizes=[1, 2], processor=processor,
                             images=tiny_vlm.vlm_images(len(tiny_vlm.IMAGE_SIZES)))


def worker(family: str, side: str, calls: int) -> dict:
    import torch

    from transformers_tpu_ext import testing

    sim = testing.install(chips=1)
    model, work, warm = _calls(family, calls)
    reference = [model.generate(**inputs, max_new_tokens=new, do_sample=False) for inputs, new in work]
    model.to("tpu")
    report: dict = {"side": side, "family": family, "model": type(model).__name__, "calls": len(work)}
    if side == "plugin_warmup":
        import transformers_tpu_ext

        before, start = sim.counters(), time.perf_counter()
        shapes = transformers_tpu_ext.warmup(model, **warm)
        delta = sim.counters() - before
        report["warmup"] = {"shapes": len(shapes), "programs": delta.programs, "wall_s": round(time.perf_counter() - start, 1)}
        torch.tpu._set_cache_only(True)
    per_call, matches, start = [], [], time.perf_counter()
    for inputs, new in work:
        before = sim.counters()
        out = model.generate(**{k: v.to("tpu") for k, v in inputs.items()}, max_new_tokens=new, do_sample=False)
        delta = sim.counters() - before
        per_call.append({"programs": delta.programs, "graphs": delta.graphs_compiled, "eager": delta.eager_programs})
        matches.append(bool(torch.equal(out.cpu(), reference[len(matches)])))
    report.update(call_summary(per_call, matches, start, side))
    return report


def call_summary(per_call: list[dict], matches: list[bool], start: float, side: str) -> dict:
    """What a side's report says of its calls: programs per call and per half, graphs, eager programs, tokens."""
    half = len(per_call) // 2
    return {
        "programs_per_call": [c["programs"] for c in per_call],
        "programs_calls_1_6": sum(c["programs"] for c in per_call[:half]),
        "programs_calls_7_12": sum(c["programs"] for c in per_call[half:]),
        "graphs_total": sum(c["graphs"] for c in per_call),
        "eager_programs_total": sum(c["eager"] for c in per_call),
        "tokens_match_cpu": all(matches),
        "calls_matching_cpu": sum(matches),
        "wall_s": round(time.perf_counter() - start, 1),
        "cache_only": side == "plugin_warmup",
    }
