"""Worker of test_tp_serving.py, one per rank under ``transformers-tpu launch`` (the simulated TPU, ``tpu_dist``).

``python -m transformers_tpu_ext.launch --nproc_per_node=N tp_serving_worker.py OUT MODEL...``: for each
MODEL, every rank loads it with ``DistributedConfig(tp_size=N)`` on its chip, warms up a
continuous-batching manager, serves mixed-length prompts in cache-only mode (a program the warm-up did
not compile raises) and writes ``OUT.<i>.rank<R>.json`` (``i``: the model's index): its tokens, plain single-process CPU Transformers' (the unsharded model,
greedy ``generate()``), the programs compiled after the warm-up, the attention of its steps and the
key-value heads its paged cache holds.
"""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist

LENGTHS = [1, 40, 9, 20, 3, 13]  # 40 and 20: prefilled in chunks (16 tokens per step), beside decodes
NEW_TOKENS = [5, 3, 5, 4, 5, 2]


def serve(path: str, out: str) -> None:
    from transformers import AutoModelForCausalLM, GenerationConfig
    from transformers.distributed import DistributedConfig

    from transformers_tpu_ext import testing
    from transformers_tpu_ext.testing.tiny import check_context_sensitive

    sim = testing.simulated_tpu()
    reference = AutoModelForCausalLM.from_pretrained(path)  # unsharded, on CPU
    check_context_sensitive(reference)
    generator = torch.Generator().manual_seed(0)
    prompts = [torch.randint(2, reference.config.vocab_size, (n,), generator=generator).tolist() for n in LENGTHS]
    expected = [
        reference.generate(torch.tensor([p]), max_new_tokens=n, min_new_tokens=n, do_sample=False)[0, len(p) :].tolist()
        for p, n in zip(prompts, NEW_TOKENS)
    ]
    model = AutoModelForCausalLM.from_pretrained(path, distributed_config=DistributedConfig(tp_size=int(os.environ["WORLD_SIZE"])))
    manager = model.init_continuous_batching(generation_config=GenerationConfig(do_sample=False, eos_token_id=1, pad_token_id=0))
    plan = manager.continuous_batching_config.tpu_plan  # AttributeError: the manager runs unpatched
    manager.warmup()
    manager.start()
    before = sim.counters()
    results: dict[str, list[int]] = {}
    with testing.cache_only():
        for prompt, new in zip(prompts, NEW_TOKENS):
            manager.add_request(prompt, max_new_tokens=new)  # the driver (rank 0) queues, every rank schedules
        while len(results) < len(prompts):  # every rank delivers the group's results
            output = manager.get_result(timeout=300)
            assert output is not None, "no result"
            if output.is_finished():
                results[output.request_id] = output.generated_tokens
    programs = (sim.counters() - before).programs
    (allocator,) = manager.batch_processor.cache.cache_allocators.values()
    result = {
        "device": str(model.device),
        "tokens": [results[f"req_{i}"] for i in range(len(prompts))],
        "expected": expected,
        "programs": programs,
        "attention": plan.attention,
        "kv_heads": allocator.num_key_value_heads,
        "shapes": len(plan.shapes),
        "k_proj": model.tp_plan.get("model.layers.*.self_attn.k_proj"),
    }
    manager.stop(block=True)
    manager.destroy()
    with open(f"{out}.rank{dist.get_rank()}.json", "w") as handle:
        json.dump(result, handle)
    dist.barrier()


if __name__ == "__main__":
    for index, model_path in enumerate(sys.argv[2:]):
        serve(model_path, f"{sys.argv[1]}.{index}")
    dist.destroy_process_group()
