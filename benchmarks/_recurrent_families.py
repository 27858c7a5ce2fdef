"""``bench_generate.py --family mamba``: 12 mixed ``generate()`` calls of a state-space or hybrid family.

Each side runs in its own interpreter: ``plain`` (Transformers without the plugin, inputs on the TPU, no cache
argument), ``guide`` (without the plugin, as the Google guide writes it: inputs on the CPU,
``cache_implementation="static"``), ``plugin`` (the plain code with the plugin) and ``plugin_warmup``
(``transformers_tpu_ext.warmup()`` first, then every call in torch_tpu's cache-only mode: a program the process
does not hold fails the call). The model is ``testing.tiny``'s context-sensitive tiny model of the family; the
workload: batches of 1 to 3 prompts of 1 to 100 tokens (every other batch of several rows ragged, left-padded as
a tokenizer pads it), 1 to 8 new tokens, greedy; tokens compared with the CPU's.
"""

from __future__ import annotations

import random
import time

from _families import call_summary

FAMILIES = ("mamba", "mamba2", "jamba", "falcon_h1", "lfm2", "qwen3_next")
SIDES = ("plain", "guide", "plugin", "plugin_warmup")
LONGEST, NEW = 100, 8


def workload(vocab: int, calls: int, seed: int = 0) -> list:
    """``calls`` deterministic ``(input_ids, attention_mask, max_new_tokens)`` on the CPU."""
    import torch

    rng, gen = random.Random(seed), torch.Generator().manual_seed(seed)
    work = []
    for index in range(calls):
        batch, length = rng.choice((1, 1, 2, 3)), rng.randint(1, LONGEST)
        ids = torch.randint(2, vocab, (batch, length), generator=gen)
        mask = torch.ones_like(ids)
        if index % 2 and batch > 1 and length > 2:
            mask[1:, : rng.randint(1, length - 1)] = 0
            ids[mask == 0] = 0
        work.append((ids, mask, rng.randint(1, NEW)))
    return work


def worker(family: str, side: str, calls: int) -> dict:
    import torch

    from transformers_tpu_ext import testing
    from transformers_tpu_ext.testing.tiny import check_context_sensitive, tiny_model

    sim = testing.install(chips=1)
    model = tiny_model(family, seed=0)
    check_context_sensitive(model)
    work = workload(model.config.vocab_size, calls)
    reference = [model.generate(ids, attention_mask=mask, max_new_tokens=new, do_sample=False) for ids, mask, new in work]
    model.to("tpu")
    report: dict = {"side": side, "family": family, "model": type(model).__name__, "calls": len(work)}
    extra = {"cache_implementation": "static"} if side == "guide" else {}
    place = (lambda tensor: tensor) if side == "guide" else (lambda tensor: tensor.to("tpu"))
    if side == "plugin_warmup":
        import transformers_tpu_ext

        before, start = sim.counters(), time.perf_counter()
        shapes = transformers_tpu_ext.warmup(model, max_prompt_length=LONGEST, max_new_tokens=NEW, max_batch_size=3)
        delta = sim.counters() - before
        report["warmup"] = {"shapes": len(shapes), "programs": delta.programs, "wall_s": round(time.perf_counter() - start, 1)}
        torch.tpu._set_cache_only(True)
    per_call, matches, start = [], [], time.perf_counter()
    for (ids, mask, new), expected in zip(work, reference):
        before = sim.counters()
        out = model.generate(place(ids), attention_mask=place(mask), max_new_tokens=new, do_sample=False, **extra)
        delta = sim.counters() - before
        per_call.append({"programs": delta.programs, "graphs": delta.graphs_compiled, "eager": delta.eager_programs,
                         "tokens": int(out.shape[1] - ids.shape[1]) * ids.shape[0], "d2h": delta.d2h_bytes})
        matches.append(bool(torch.equal(out.cpu(), expected)))
    tokens = sum(c["tokens"] for c in per_call)
    report.update(call_summary(per_call, matches, start, side))
    report["d2h_bytes_per_token"] = round(sum(c["d2h"] for c in per_call) / max(tokens, 1), 1)
    return report
