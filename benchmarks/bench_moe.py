"""Mixture-of-experts generation on the simulated TPU, with and without transformers-tpu-ext, in one run.

    python benchmarks/bench_moe.py            # full run: 4 families (a few minutes on 2 cores)
    python benchmarks/bench_moe.py --quick    # smoke run (tests/experts/test_moe_benchmark.py runs it)
    python benchmarks/bench_moe.py --output benchmarks/results/moe.json

Two sides, each in its own subprocess, on the same seeded context-sensitive tiny models
(``testing.tiny.MOE_ARCHITECTURES``: Mixtral, Qwen3-MoE, gpt-oss, DeepSeek-V3), Transformers' default experts
implementation (``grouped_mm``):

- ``plain``: Transformers alone (``TRANSFORMERS_TPU_EXT_DISABLE=1``), the guide's recipe (inputs on the CPU,
  ``cache_implementation="static"``): ``grouped_mm`` (torch-tpu's ``histc`` and ``_grouped_mm``) in prefill,
  ``batched_mm`` in decode (Transformers switches to it on every device but CPU);
- ``plugin``: the plain GPU code (inputs ``.to(model.device)``, no cache argument) with the plugin and JAX:
  megablox's grouped matmul in prefill and decode.

Per family: the tokens against the CPU's, programs compiled by a first call and by a second call of other
prompts of the same shapes, and the expert weight bytes read per decode step and per prefill against the
floor: the selected experts' bytes (each expert some row of the step routed to, read once; computed on the CPU
from the generated sequences, independently of either path). Reads are what the simulated TPU counts: the
kernel's block copies (``testing.megablox``), what torch operations read of the expert weights
(``testing.reads``: a gather reads each picked expert, ``_grouped_mm`` its whole weight operand, an upper bound
since XLA's TPU lowering of ``ragged_dot`` is not public).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from _common import emit, run_worker, worker_env, write_report

HERE = Path(__file__).resolve().parent
ARCHS = ("mixtral", "qwen3_moe", "gpt_oss", "deepseek_v3")
#: More experts than the tiny defaults, in the ratios of the real models (gpt-oss-20b: 4 of 32, Qwen3-30B-A3B: 8 of
#: 128, DeepSeek-V3: 8 of 256 in 8 groups, Mixtral: 2 of 8), so that a step selects a fraction of them.
EXPERTS = {
    "mixtral": {},
    "qwen3_moe": {"num_experts": 32, "num_experts_per_tok": 4},
    "gpt_oss": {"num_local_experts": 32, "num_experts_per_tok": 4},
    "deepseek_v3": {"n_routed_experts": 32, "num_experts_per_tok": 4, "n_group": 4, "topk_group": 2},
}


def sizes(quick: bool) -> dict:
    if quick:
        return {"archs": ["qwen3_moe"], "rows": 4, "prompt": 12, "new": 4}
    return {"archs": list(ARCHS), "rows": 8, "prompt": 24, "new": 12}


# -------------------------------------------------------------------------------------------------
# Worker


def _expert_modules(model):
    return [m for m in model.modules() if hasattr(m, "has_gate") and hasattr(m, "down_proj")]


def _expert_bytes(module) -> int:
    """One expert's weight bytes (its gate-and-up or up projection and its down projection)."""
    up = module.gate_up_proj if module.has_gate else module.up_proj
    return (up[0].numel() + module.down_proj[0].numel()) * up.element_size()


def floor_per_step(model, sequences, prompt: int) -> tuple[float, float]:
    """The selected experts' bytes per decode step (mean) and of the prefill, from the CPU's routing of the
    generated sequences (teacher forcing: each position's experts as the step that processed it chose them)."""
    import torch

    routes = []
    hooks = [m.register_forward_pre_hook(lambda mod, args: routes.append((mod, args[1])), with_kwargs=False)
             for m in _expert_modules(model)]
    try:
        with torch.no_grad():
            model(sequences)
    finally:
        for hook in hooks:
            hook.remove()
    rows, length = sequences.shape
    step_bytes = [0] * length
    for module, index in routes:  # index: [rows * length, top_k]
        per_position = index.view(rows, length, -1)
        for p in range(length):
            step_bytes[p] += len(set(per_position[:, p].reshape(-1).tolist())) * _expert_bytes(module)
    prefill = 0
    for module, index in routes:
        prefill += len(set(index.view(rows, length, -1)[:, :prompt].reshape(-1).tolist())) * _expert_bytes(module)
    decode = step_bytes[prompt : length - 1]  # the tokens decode steps processed: the generated ones but the last
    return sum(decode) / max(len(decode), 1), prefill


def worker(side: str, size: dict) -> dict:
    import torch

    from transformers_tpu_ext import testing
    from transformers_tpu_ext.testing import megablox, reads, tiny

    sim = testing.install(chips=1)
    plugin = side == "plugin"
    out = {}
    for arch in size["archs"]:
        model = tiny.tiny_model(arch, **EXPERTS[arch])
        tiny.check_context_sensitive(model)
        gen = torch.Generator().manual_seed(0)
        prompts = [torch.randint(2, 300, (size["rows"], size["prompt"]), generator=gen) for _ in range(2)]
        new = size["new"]
        kwargs = dict(do_sample=False, max_new_tokens=new, min_new_tokens=new)
        expected = [model.generate(p, **kwargs) for p in prompts]
        decode_floor, prefill_floor = floor_per_step(model, expected[0], size["prompt"])
        model.to("tpu")
        weights = [p for m in _expert_modules(model) for p in (m.gate_up_proj if m.has_gate else m.up_proj, m.down_proj)]

        def run(p, n=new):
            args = dict(kwargs, max_new_tokens=n, min_new_tokens=n)
            if plugin:
                return model.generate(p.to("tpu"), **args).cpu()
            return model.generate(p, cache_implementation="static", **args).cpu()

        def measured(p, n):
            megablox.STATS.reset()
            with reads.watch(weights) as counter:
                run(p, n)
            return megablox.STATS.weight_bytes_read + counter.bytes, dict(counter.by_op)

        start = time.perf_counter()
        before = sim.counters()
        first = run(prompts[0])
        first_programs = (sim.counters() - before).programs
        before = sim.counters()
        second = run(prompts[1])
        second_programs = (sim.counters() - before).programs
        prefill_read, prefill_ops = measured(prompts[0], 1)
        total_read, ops = measured(prompts[0], new)
        decode_read = (total_read - prefill_read) / (new - 1)
        out[arch] = {
            "tokens_match_cpu": bool(torch.equal(first, expected[0]) and torch.equal(second, expected[1])),
            "programs_first_call": first_programs,
            "programs_second_call": second_programs,
            "decode_weight_bytes_per_step": round(decode_read),
            "decode_floor_bytes_per_step": round(decode_floor),
            "decode_read_over_floor": round(decode_read / decode_floor, 3),
            "prefill_weight_bytes": prefill_read,
            "prefill_floor_bytes": prefill_floor,
            "prefill_read_over_floor": round(prefill_read / prefill_floor, 3),
            "reads_by_op": {k.removeprefix("aten."): v for k, v in ops.items()} | (
                {"megablox gmm": megablox.STATS.weight_bytes_read} if megablox.STATS.gmm_calls else {}),
            "experts": f"{len(_expert_modules(model))} layers, {model.config.get_text_config().num_experts_per_tok} of "
                       f"{_expert_modules(model)[0].num_experts} experts per token",
            "seconds": round(time.perf_counter() - start, 1),
        }
    return out


# -------------------------------------------------------------------------------------------------
# Driver


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--output")
    parser.add_argument("--worker", choices=("plain", "plugin"))
    args = parser.parse_args(argv)
    size = sizes(args.quick)
    if args.worker:
        emit(worker(args.worker, size))
        return 0
    # The kernel's reference runs op by op on JAX's CPU backend; unoptimized XLA programs compile faster.
    xla = {"XLA_FLAGS": "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"}
    sides = {
        "plain": run_worker(__file__, ["--worker", "plain", *(["--quick"] if args.quick else [])],
                            worker_env(TRANSFORMERS_TPU_EXT_DISABLE="1", **xla)),
        "plugin": run_worker(__file__, ["--worker", "plugin", *(["--quick"] if args.quick else [])], worker_env(**xla)),
    }
    report = {"workload": size, "sides": sides}
    write_report(report, args.output)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    sys.exit(main())
