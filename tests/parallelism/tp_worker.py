"""Worker for the multi-process TP tests (tests/parallelism/test_tp_multiprocess.py); run under torchrun (gloo, CPU).

``python -m torch.distributed.run --standalone --nproc_per_node=N tests/parallelism/tp_worker.py SPEC.json``

SPEC.json: ``{"out": dir, "cases": [{"name", "model", "tp_plan"?, "expect_error"?, "grad"?}]}``. For each
case every rank loads ``model`` unsharded and with ``DistributedConfig(tp_size=N, tp_plan=...)``,
compares logits and greedy ``generate()`` tokens, and writes ``<out>/<name>.rank<R>.json``.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import traceback

import torch
import torch.distributed as dist

PROMPT = [[3, 17, 42, 9, 88, 5, 61]]


class _Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def _local_bytes(model: torch.nn.Module) -> int:
    from torch.distributed.tensor import DTensor

    seen, total = set(), 0
    for param in model.parameters():
        if id(param) in seen:
            continue
        seen.add(id(param))
        local = param.to_local() if isinstance(param, DTensor) else param
        total += local.numel() * local.element_size()
    return total


def _run_case(case: dict, tp_size: int, rank: int, capture: _Capture) -> dict:
    from transformers import AutoModelForCausalLM
    from transformers.distributed import DistributedConfig

    ids = torch.tensor(PROMPT)
    reference = AutoModelForCausalLM.from_pretrained(case["model"])
    with torch.no_grad():
        ref_logits = reference(ids).logits
    ref_tokens = reference.generate(ids, max_new_tokens=8, do_sample=False)

    capture.lines.clear()
    config = DistributedConfig(tp_size=tp_size, tp_plan=case.get("tp_plan"))
    try:
        model = AutoModelForCausalLM.from_pretrained(case["model"], distributed_config=config)
        with torch.no_grad():
            logits = model(ids).logits
        tokens = model.generate(ids, max_new_tokens=8, do_sample=False)
    except Exception as error:  # noqa: BLE001 - reported to the test (e.g. upstream's shape error)
        frames = [frame.name for frame in traceback.extract_tb(error.__traceback__)]
        return {"error": f"{type(error).__name__}: {error}", "error_type": type(error).__name__, "frames": frames}
    attention = model.model.layers[0].self_attn
    k_weight = attention.k_proj.weight
    result = {
        "max_logit_diff": (logits.float() - ref_logits.float()).abs().max().item(),
        "tokens": tokens.tolist(),
        "ref_tokens": ref_tokens.tolist(),
        "rank_bytes": _local_bytes(model),
        "full_bytes": _local_bytes(reference),
        "tp_plan": dict(model.tp_plan),
        "default_tp_plan": dict(reference.tp_plan),
        "user_tp_plan_after": config.tp_plan,
        "log": [line for line in capture.lines if "transformers-tpu-ext" in line],
        "num_key_value_groups": getattr(attention, "num_key_value_groups", None),
        "k_proj_local_shape": list(k_weight.to_local().shape if hasattr(k_weight, "to_local") else k_weight.shape),
        "tied": model.lm_head.weight is model.model.embed_tokens.weight,
        "ref_tied": reference.lm_head.weight is reference.model.embed_tokens.weight,
    }
    if case.get("grad"):
        result["grad_diff"] = _grad_diff(model, reference, ids, tp_size, rank)
    return result


def _grad_diff(model, reference, ids, tp_size: int, rank: int) -> dict:
    """Largest difference between this rank's k/v/q weight gradients and the unsharded ones."""
    from torch.distributed.tensor import DTensor

    config = reference.config
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    head_dim = config.head_dim
    for m in (model, reference):
        m.zero_grad(set_to_none=True)
        m.train()
        m(ids).logits.float().pow(2).mean().backward()
    out = {}
    for name in ("k_proj", "v_proj", "q_proj"):
        got = getattr(model.model.layers[0].self_attn, name).weight.grad
        got = got.to_local() if isinstance(got, DTensor) else got
        want = getattr(reference.model.layers[0].self_attn, name).weight.grad
        if name == "q_proj":
            per_rank = heads // tp_size * head_dim
            want = want[rank * per_rank : (rank + 1) * per_rank]
        elif got.shape != want.shape:
            kv_head = rank // (tp_size // kv_heads)
            want = want[kv_head * head_dim : (kv_head + 1) * head_dim]
        out[name] = (got - want).abs().max().item()
    return out


def main(spec_path: str) -> None:
    with open(spec_path) as handle:
        spec = json.load(handle)
    capture = _Capture()
    logging.getLogger("transformers_tpu_ext").addHandler(capture)
    tp_size = int(os.environ["WORLD_SIZE"])
    rank = int(os.environ["RANK"])
    for case in spec["cases"]:
        result = _run_case(case, tp_size, rank, capture)
        result["active_patches"] = __import__("transformers_tpu_ext").active_patches()
        with open(os.path.join(spec["out"], f"{case['name']}.rank{rank}.json"), "w") as handle:
            json.dump(result, handle)
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
