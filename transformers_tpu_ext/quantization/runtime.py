"""Quantized weights on TPU at the torch level: what the quantization glue (and serving) calls.

torch_tpu 0.2.0 has no int8/int4 matmul kernel, and its ``_scaled_mm`` takes tensor-wise, row-wise and
1x32 (mxfp8) scales only, not the 128x128 blocks of FineGrainedFP8 checkpoints. An 8-bit weight therefore
runs as plain operations the compiler can fuse: HBM holds (and a decode step reads) the 8-bit weight and
its scales; the bf16 weight exists only inside the compiled graph.

- :func:`dequantize_blockwise`: the arithmetic of Transformers' ``Fp8Dequantize`` (a float32 product,
  then the target dtype), so a TPU model computes what a CPU model loaded with ``dequantize=True`` does.
- :func:`fp8_linear`: ``F.linear`` over the dequantized weight, with upstream's signature.
- :func:`resident_bytes`: bytes tensors hold on the TPU, tensor subclasses (torchao's ``Int8Tensor``, whose
  wrapper reports its outer dtype and ``data_ptr() == 0``) counted by their inner tensors, each tensor
  once (by identity, never by ``data_ptr``: on a chip it is a handle that changes with every write).
- :func:`count`: a config's :class:`~transformers_tpu_ext.quantization.capacity.ModelCounts`, from a model built
  on the meta device (no weights, no download).

Imported by the glue only, after Transformers.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Iterable

from .capacity import ModelCounts

__all__ = ["count", "dequantize_blockwise", "fp8_linear", "resident_bytes", "tensor_leaves"]


def dequantize_blockwise(weight: Any, scale_inv: Any, dtype: Any) -> Any:
    """``weight`` (``[..., N, K]`` float8) times its scales (one, or ``[..., ceil(N/bn), ceil(K/bk)]``
    blocks) in float32, cast to ``dtype``. Static shapes, no data-dependent branch: it traces into a graph."""
    import torch

    w = weight.to(torch.float32)
    s = scale_inv.to(torch.float32)
    if s.dim() == 0 or s.numel() == 1:
        return (w * s.reshape(())).to(dtype)
    rows, cols = w.shape[-2:]
    srows, scols = s.shape[-2:]
    bm, bn = -(-rows // srows), -(-cols // scols)
    if rows == srows * bm and cols == scols * bn:
        q = w.reshape(*w.shape[:-2], srows, bm, scols, bn)
        return (q * s[..., :, None, :, None]).reshape(w.shape).to(dtype)
    full = s.repeat_interleave(bm, dim=-2)[..., :rows, :].repeat_interleave(bn, dim=-1)[..., :cols]
    return (w * full).to(dtype)


def fp8_linear(
    input: Any,  # noqa: A002 - upstream's names
    weight: Any,
    weight_scale_inv: Any,
    block_size: Any = None,
    bias: Any = None,
    activation_scale: Any = None,
    allow_deepgemm: bool = True,
) -> Any:
    """Weight-only FP8 linear (W8A16): the activations keep their dtype; ``activation_scale`` is not used
    (as with ``dequantize=True``)."""
    import torch.nn.functional as F

    w = dequantize_blockwise(weight, weight_scale_inv, input.dtype)
    return F.linear(input, w, None if bias is None else bias.to(input.dtype))


def tensor_leaves(tensor: Any) -> Iterable[Any]:
    """The tensors holding ``tensor``'s data: itself, or a traceable subclass' inner tensors (recursively).

    A subclass whose inner tensors live on another device type than itself is how a device represents
    its tensors (the simulated TPU's wrapper holds a CPU tensor): it is a leaf."""
    import torch
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    if is_traceable_wrapper_subclass(tensor):
        names, _ = tensor.__tensor_flatten__()
        inner = [getattr(tensor, name, None) for name in names]
        inner = [t for t in inner if isinstance(t, torch.Tensor)]  # a DTensor also names its DeviceMesh
        if inner and all(t.device.type == tensor.device.type for t in inner):
            for t in inner:
                yield from tensor_leaves(t)
            return
    yield tensor


def resident_bytes(tensors: Iterable[Any], on: Callable[[Any], bool]) -> int:
    """Bytes of the leaves of ``tensors`` that ``on(leaf)`` accepts, each leaf counted once."""
    seen: dict[int, int] = {}
    for tensor in tensors:
        for leaf in tensor_leaves(tensor):
            if on(leaf):
                seen[id(leaf)] = leaf.numel() * leaf.element_size()
    return sum(seen.values())


def count(config: Any) -> ModelCounts:
    """Count a causal LM's parameters by category from its config, on the meta device."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    text = config.get_text_config(decoder=True)
    embeddings_module = model.get_input_embeddings()
    head_module = model.get_output_embeddings()
    tied = (
        head_module is not None and embeddings_module is not None and head_module.weight is embeddings_module.weight
    )
    seen: set[int] = set()
    linear = rows = blocks = embeddings = head = other = expert_linear = experts = 0
    for name, module in model.named_modules():
        for pname, p in module.named_parameters(recurse=False):
            if id(p) in seen:
                continue
            seen.add(id(p))
            n = p.numel()
            if module is embeddings_module:
                embeddings += n
            elif module is head_module:
                head += 0 if tied else n
            elif isinstance(module, torch.nn.Linear) and pname == "weight":
                linear += n
                rows += p.shape[0]
                blocks += math.ceil(p.shape[0] / 128) * math.ceil(p.shape[1] / 128)
            elif p.dim() == 3 and "experts" in name:  # fused MoE expert stacks [experts, out, in]
                linear += n
                expert_linear += n
                experts = max(experts, p.shape[0])
                rows += p.shape[0] * p.shape[1]
                blocks += p.shape[0] * math.ceil(p.shape[1] / 128) * math.ceil(p.shape[2] / 128)
            else:
                other += n
    layer_types = list(getattr(text, "layer_types", None) or ["full_attention"] * text.num_hidden_layers)
    attention_layers = sum(1 for kind in layer_types if "attention" in kind)
    heads = text.num_attention_heads
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    return ModelCounts(
        name=type(model).__name__,
        linear=linear,
        linear_rows=rows,
        linear_blocks=blocks,
        embeddings=embeddings,
        head=head,
        other=other,
        layers=text.num_hidden_layers,
        attention_layers=attention_layers,
        kv_heads=kv_heads,
        head_dim=head_dim,
        attention_heads=heads,
        expert_linear=expert_linear,
        experts=experts,
        experts_per_token=int(getattr(text, "num_experts_per_tok", 0) or 0) if experts else 0,
    )


def load_config(model_or_config: Any) -> Any:
    """A config from a ``PretrainedConfig``, a model, a ``config.json`` path, a local folder or a Hub id
    (``AutoConfig.from_pretrained``: the config file alone is downloaded)."""
    import os

    from transformers import AutoConfig, PretrainedConfig

    if isinstance(model_or_config, PretrainedConfig):
        return model_or_config
    config = getattr(model_or_config, "config", None)
    if isinstance(config, PretrainedConfig):
        return config
    path = os.fspath(model_or_config)
    if os.path.isfile(path):
        import json

        with open(path) as handle:
            data = json.load(handle)
        return AutoConfig.for_model(**data)
    return AutoConfig.from_pretrained(path)


def checkpoint_format(config: Any) -> str | None:
    """The weight format a checkpoint's ``quantization_config`` states, if the fit report knows it."""
    quantization = getattr(config, "quantization_config", None)
    if quantization is None:
        return None
    method = quantization.get("quant_method") if isinstance(quantization, dict) else getattr(quantization, "quant_method", None)
    method = getattr(method, "value", method)
    return {"fp8": "fp8", "torchao": "int8"}.get(str(method))


def fit_report(
    model_or_config: Any,
    *,
    chips: Any = None,
    weights: Any = None,
    kv: Any = "bf16",
    generations: Any = None,
    context: int = 4096,
    batch: int = 1,
) -> list[Any]:
    """:func:`~transformers_tpu_ext.quantization.capacity.fit` of a model or config, for each weight and KV format.

    ``weights`` / ``kv``: a format or a sequence of them (default weights: bf16, int8 and fp8; an FP8
    checkpoint's own format first). ``chips``: a count or a sequence of counts (default: every count a
    generation has a topology for).
    """
    from .capacity import fit

    config = load_config(model_or_config)
    counts = count(config)
    if weights is None:
        own = checkpoint_format(config)
        weights = [own] + [w for w in ("bf16", "int8", "fp8") if w != own] if own else ["bf16", "int8", "fp8"]
    weights = [weights] if isinstance(weights, str) else list(weights)
    kv = [kv] if isinstance(kv, str) else list(kv)
    chips = None if chips is None else ((chips,) if isinstance(chips, int) else tuple(chips))
    generations = None if generations is None else ((generations,) if isinstance(generations, str) else tuple(generations))
    return [
        fit(counts, weights=w, kv=k, chips=chips, generations=generations, context=context, batch=batch)
        for w in weights
        for k in kv
    ]
