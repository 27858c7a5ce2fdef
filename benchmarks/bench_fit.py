"""Models that fit: bytes a decode step reads, and the resulting ceilings, for an 8B-shaped model, in one run.

    python benchmarks/bench_fit.py                  # about a minute on 2 cores
    python benchmarks/bench_fit.py --output benchmarks/results/fit.json

Two parts, printed as one JSON report:

- ``model``: Llama-3.1-8B's shape (built from its config on the meta device: no weights, no download),
  counted by ``transformers_tpu_ext.quantization``: bytes of weights in bf16, int8 (torchao weight-only)
  and FP8 (FineGrainedFP8 blocks), KV-cache bytes per position in bf16 and int8 (int8 data and a float32
  scale per position and head: the plugin's opt-in int8 KV cache), the bytes a decode step
  reads at 4,096 cached positions for batch 1 and 8, and the decode ceilings (HBM bandwidth / bytes read
  per step) on one v5e, v6e and v5p chip, with whether the weights fit its placement budget.
- ``measured``: the same counts checked against what the simulated TPU holds, with and without the plugin,
  each side in its own process: a tiny Llama (bf16) loaded unquantized, with
  ``TorchAoConfig(Int8WeightOnlyConfig())`` and from a FineGrainedFP8 checkpoint (``device_map="auto"``;
  without the plugin, loaded and moved with ``.to("tpu")`` as the Google TPU guide does):
  the bytes its decoder's linear weights take on the TPU (inner tensors of quantized ones), against the
  count's prediction. Without the plugin, the FP8 checkpoint is dequantized to bf16 (upstream's rule without a
  GPU). And ``kv_cache``: the bytes per cached position of a tiny bf16 Llama's static cache (head_dim 64)
  on the TPU: upstream's (bf16) without the plugin, the plugin's int8 cache
  (``TRANSFORMERS_TPU_EXT_GENERATE_KV_CACHE=int8``) with it, against the count's prediction.

The ceilings are bounds from bandwidth alone, and assume the dequantization is fused into the matmul
(unmeasured on a chip; see docs/quantization.md).
"""

from __future__ import annotations

import argparse
import sys
import tempfile

from _common import emit, run_worker, worker_env, write_report

#: Llama-3.1-8B's shape (meta-llama/Llama-3.1-8B config.json).
LLAMA_8B = dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                num_key_value_heads=8, vocab_size=128256, tie_word_embeddings=False, max_position_embeddings=131072)
GENERATIONS = ("v5e", "v6e", "v5p")
CONTEXT = 4096
BATCHES = (1, 8)
GiB = 1 << 30


def model_part() -> dict:
    from transformers import LlamaConfig

    from transformers_tpu_ext.quantization import capacity
    from transformers_tpu_ext.quantization.runtime import count

    counts = count(LlamaConfig(**LLAMA_8B))
    rows = []
    for weights in ("bf16", "int8", "fp8"):
        for kv in ("bf16", "int8"):
            by_batch = {b: capacity.fit(counts, weights=weights, kv=kv, chips=(1,), generations=GENERATIONS,
                                        context=CONTEXT, batch=b) for b in BATCHES}
            first = by_batch[BATCHES[0]]
            row = {
                "weights": weights,
                "kv": kv,
                "kv_cache": "model dtype" if kv == "bf16" else "int8 (TRANSFORMERS_TPU_EXT_GENERATE_KV_CACHE=int8)",
                "weight_bytes": first.weight_bytes,
                "weight_gib": round(first.weight_bytes / GiB, 2),
                "kv_bytes_per_position": first.kv_bytes_per_position,
                "step_bytes": {f"batch_{b}": first.weight_bytes + CONTEXT * b * first.kv_bytes_per_position for b in BATCHES},
                "chips": {},
            }
            for gen in GENERATIONS:
                one = {b: next(r for r in report.chips if r.generation == gen) for b, report in by_batch.items()}
                row["chips"][gen] = {
                    "fits": one[1].fits,
                    "budget_gib": round(one[1].budget_per_chip / GiB, 2),
                    "steps_per_s_batch_1": one[1].steps_per_s_at_context,
                    "tokens_per_s_batch_8": one[8].tokens_per_s_at_context,
                }
            rows.append(row)
    return {
        "model": "Llama-3.1-8B shape (meta device)",
        "parameters": counts.parameters,
        "context": CONTEXT,
        "bandwidth_bytes_per_s": {gen: capacity.CHIPS[gen].bandwidth for gen in GENERATIONS},
        "bandwidth_sources": {gen: capacity.CHIPS[gen].source for gen in GENERATIONS},
        "formats": rows,
    }


# -------------------------------------------------------------------------------------------------
# Worker: what the simulated TPU holds (one process per side)


def worker(side: str) -> dict:
    import warnings

    warnings.filterwarnings("ignore")
    import torch
    from torchao.quantization import Int8WeightOnlyConfig
    from transformers import AutoModelForCausalLM, TorchAoConfig

    from transformers_tpu_ext import testing
    from transformers_tpu_ext.quantization import capacity
    from transformers_tpu_ext.quantization.runtime import count, tensor_leaves
    from transformers_tpu_ext.testing.tiny import save_tiny_fp8_model, save_tiny_model

    testing.install(chips=1)
    root = tempfile.mkdtemp()
    plain = save_tiny_model(root + "/llama", "llama")
    fp8 = save_tiny_fp8_model(root + "/llama-fp8", "llama", block=(16, 16))
    loads = {
        "bf16": (plain, {}),
        "int8": (plain, {"quantization_config": TorchAoConfig(Int8WeightOnlyConfig())}),
        "fp8": (fp8, {}),
    }
    out = {}
    for name, (path, kwargs) in loads.items():
        if side == "plugin":
            model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16, device_map="auto", **kwargs)
        else:  # without the plugin device_map="auto" finds no TPU: load, then move (the guide's way)
            model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16, **kwargs).to("tpu")
        linear = [(n, m) for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and ".layers." in n]
        on_tpu = sum(leaf.numel() * leaf.element_size() for _, m in linear for p in m.parameters(recurse=False)
                     for leaf in tensor_leaves(p) if leaf.device.type == "tpu")
        counts = count(model.config)
        predicted = capacity.weight_bytes(counts, name)["linear"]
        if name == "fp8":  # the tiny checkpoint's scales are per 16x16 block, the count's per 128x128
            blocks = sum(-(-m.weight.shape[0] // 16) * -(-m.weight.shape[1] // 16) for _, m in linear)
            predicted += 4 * (blocks - counts.linear_blocks)
        weight = linear[0][1].weight
        out[name] = {
            "layer": type(linear[0][1]).__name__,
            "weight_dtypes": sorted({str(leaf.dtype) for leaf in tensor_leaves(weight)}),
            "linear_bytes_on_tpu": on_tpu,
            "linear_bytes_bf16": 2 * counts.linear,
            "ratio_to_bf16": round(on_tpu / (2 * counts.linear), 3),
            "predicted_linear_bytes": predicted,
        }
    out["kv_cache"] = kv_cache_bytes(side, save_tiny_model(root + "/llama-64", "llama", head_dim=64))
    return out


def kv_cache_bytes(side: str, path: str) -> dict:
    """Bytes per cached position of the static cache a bf16 ``generate()`` runs with on the TPU."""
    import torch
    from transformers import AutoModelForCausalLM

    from transformers_tpu_ext.quantization import capacity
    from transformers_tpu_ext.quantization.runtime import count

    ids = torch.tensor([[5, 6, 7, 8, 9, 10, 11, 12]])
    if side == "plugin":
        from transformers_tpu_ext.generation import config as settings, static_cache

        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16, device_map="auto")
        made, original = [], static_cache.full_length_layers
        static_cache.full_length_layers = lambda cache, length: (made.append(cache), original(cache, length))[1]
        settings.configure(kv_cache="int8")
        model.generate(ids.to("tpu"), max_new_tokens=4, do_sample=False)
        static_cache.full_length_layers = original
        cache, kv = made[0], "int8"
    else:  # upstream's static cache (compiling it would need inductor, which fails on TPU tensors)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).to("tpu")
        cache = model.generate(ids.to("tpu"), max_new_tokens=4, do_sample=False, cache_implementation="static",
                               disable_compile=True, return_dict_in_generate=True).cache
        kv = "bf16"
    layers = cache.layers
    held = sum(t.numel() * t.element_size() for layer in layers for t in
               (layer.keys, layer.values, getattr(layer, "key_scales", None), getattr(layer, "value_scales", None)) if t is not None)
    positions = layers[0].keys.shape[0] * layers[0].max_cache_len
    return {
        "format": kv,
        "dtypes": sorted({str(layer.keys.dtype) for layer in layers}),
        "bytes": held,
        "bytes_per_position": held // positions,
        "predicted_bytes_per_position": capacity.kv_bytes_per_position(count(model.config), kv),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sides", default="plain,plugin", help="comma list of measured sides (plain, plugin)")
    parser.add_argument("--output", help="also write the JSON report to this file")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        emit(worker(args.worker))
        return 0
    report = {"model": model_part(), "measured": {}}
    for side in [s for s in args.sides.split(",") if s]:
        env = worker_env(TRANSFORMERS_TPU_EXT_DISABLE="1" if side == "plain" else None, OMP_NUM_THREADS="1")
        report["measured"][side] = run_worker(__file__, ["--worker", side], env)
    write_report(report, args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
