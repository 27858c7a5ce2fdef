"""Worker of test_expert_parallel.py, one per rank under ``transformers-tpu launch`` (the simulated TPU, ``tpu_dist``).

``python -m transformers_tpu_ext.launch --nproc_per_node=N ep_worker.py OUT MODEL...``: for each MODEL, every rank
loads it with ``DistributedConfig(tp_size=N, ep_size=N)`` (Transformers' expert-parallel plan: each chip holds
``experts / N`` whole experts) on its chip, computes the logits of two prompts and greedy ``generate()`` tokens,
and writes ``OUT.<i>.rank<R>.json``: its logits' largest difference from the unsharded model's on one chip (the
same process, before sharding), its tokens and the unsharded ones, its local expert count, the experts path.
"""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist

NEW_TOKENS = 5


def run(path: str, out: str) -> None:
    from transformers import AutoModelForCausalLM
    from transformers.distributed import DistributedConfig

    from transformers_tpu_ext.testing import megablox

    world = int(os.environ["WORLD_SIZE"])
    prompts = torch.randint(2, 300, (2, 10), generator=torch.Generator().manual_seed(0))
    single = AutoModelForCausalLM.from_pretrained(path).to("tpu")  # the unsharded model on one chip
    with torch.no_grad():
        expected_logits = single(prompts.to("tpu")).logits.cpu()
    expected = single.generate(prompts.to("tpu"), max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False).cpu()
    del single
    model = AutoModelForCausalLM.from_pretrained(path, distributed_config=DistributedConfig(tp_size=world, ep_size=world))
    experts = next(m for m in model.modules() if hasattr(m, "has_gate") and hasattr(m, "down_proj"))
    megablox.STATS.reset()
    with torch.no_grad():
        logits = model(prompts.to(model.device)).logits
    logits = (logits.full_tensor() if hasattr(logits, "full_tensor") else logits).cpu()
    kernel_calls = megablox.STATS.gmm_calls
    tokens = model.generate(prompts.to(model.device), max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False).cpu()
    result = {
        "device": str(model.device),
        "logits_max_diff": float((logits - expected_logits).abs().max()),
        "tokens": tokens.tolist(),
        "expected": expected.tolist(),
        "local_experts": int(experts.num_experts),
        "expert_parallel": bool(getattr(experts, "_is_expert_parallel", False)),
        "kernel_calls": kernel_calls,
    }
    with open(f"{out}.rank{dist.get_rank()}.json", "w") as handle:
        json.dump(result, handle)
    dist.barrier()


if __name__ == "__main__":
    for index, model_path in enumerate(sys.argv[2:]):
        run(model_path, f"{sys.argv[1]}.{index}")
    dist.destroy_process_group()
