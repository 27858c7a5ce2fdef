"""Which attention a TPU serving step runs, and what each reads: plain functions over plain data.

Two paths compute the same attention over Transformers' paged cache (``docs/serving.md``):

- ``"ragged"``: JAX's ragged paged attention kernel (``jax.experimental.pallas.ops.tpu.
  ragged_paged_attention``, the kernel vLLM TPU and SGLang run), called through
  ``torch.tpu.pallas.jax_op`` inside the compiled step. Each sequence reads the pages of its own
  ``kv_len``, prefill and decode mixed in one call.
- ``"paged"`` (the present path): plain PyTorch; every scheduled token gathers its request's
  ``max_len`` keys and values through a fixed-width block table.

:func:`attention_path` is the "safe when" predicate of the kernel path; everything it does not
positively recognise takes the present path, with the reason said once in the log. The byte counts
(:func:`kernel_kv_bytes`, :func:`gathered_kv_bytes`, :func:`held_kv_bytes`) make both comparable.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "ATTENTION_SETTINGS",
    "JAX_EXTRA",
    "KERNEL",
    "KernelFacts",
    "attention_path",
    "gathered_kv_bytes",
    "heads_tile",
    "held_kv_bytes",
    "kernel_kv_bytes",
]

#: ``TRANSFORMERS_TPU_EXT_SERVE_ATTENTION``: ``auto`` takes the kernel where :func:`attention_path`
#: allows it; ``paged`` always takes the present path.
ATTENTION_SETTINGS = ("auto", "paged")
#: The kernel: where JAX ships it and the arguments this plugin passes (its combined K/V layout).
KERNEL = "jax.experimental.pallas.ops.tpu.ragged_paged_attention"
KERNEL_ARGS = ("q", "kv_pages", "kv_lens", "page_indices", "cu_q_lens", "num_seqs")
KERNEL_KEYWORDS = ("sm_scale", "sliding_window", "soft_cap")
#: How a user gets it (the range CI tests: scripts/check_jax.sh).
JAX_EXTRA = "pip install 'transformers-tpu-ext[jax]'"
JAX_RANGE = ">=0.10,<0.11"
#: The head size the kernel takes: TPU lanes (vLLM TPU pads other sizes to this; not done here).
HEAD_ALIGNMENT = 128
#: Model dtypes the path computes in (the kernel's q and pages; the TPU's float dtypes).
DTYPES = {"float32": 4, "bfloat16": 2}


@dataclass(frozen=True)
class KernelFacts:
    """What the glue reads off the model, the settings and the installed JAX (plain data)."""

    setting: str = "auto"  # ServeSettings.attention
    jax: str | None = None  # the installed JAX's version, None if it does not import
    kernel_args: tuple[str, ...] = ()  # the kernel's parameters in that JAX (empty: no kernel)
    jax_op: bool = False  # torch.tpu.pallas.jax_op exists
    head_dim: int = 0
    heads: int = 0
    kv_heads: int = 0
    dtype: str = "float32"  # the model's dtype (the pages' when the cache is not int8)
    attention_sinks: bool = False
    kv_cache: str | None = None  # the TPU paged cache format: None (model dtype) or "int8"


def heads_tile(kv_heads: int, itemsize: int) -> bool:
    """Whether the kernel tiles ``2 * kv_heads`` combined K/V heads of ``itemsize`` bytes: its rule
    (``get_min_heads_per_blk``): a whole number of 32-bit rows, 1, 2, 4, 8 or a multiple of 8 of them."""
    packing = 4 // itemsize
    combined = 2 * kv_heads
    if combined % packing:
        return False
    rows = combined // packing
    return rows in (1, 2, 4, 8) or rows % 8 == 0


def attention_path(facts: KernelFacts) -> tuple[str, str]:
    """``("ragged", why)`` if the serving step's attention runs JAX's ragged paged attention kernel,
    else ``("paged", why not)`` (the present plain-PyTorch paged attention).

    Safe when the kernel computes what the present path computes: softmax(scale * q k^T) v over each
    request's own positions, causal, with the layer's sliding window and logit soft cap (both are
    kernel arguments), grouped-query heads; with no attention sinks (the kernel has none) and pages
    in the model's float dtype (the kernel's ``k_scale``/``v_scale`` are one static float per cache,
    the int8 cache's scales are per position and head). The kernel must exist in the installed JAX
    with the combined K/V page layout, torch_tpu must offer ``jax_op``, and the head size and head
    count must be ones the kernel tiles.
    """
    if facts.setting == "paged":
        return "paged", "TRANSFORMERS_TPU_EXT_SERVE_ATTENTION=paged"
    if facts.jax is None:
        return "paged", f"JAX is not installed ({JAX_EXTRA} installs JAX{JAX_RANGE} with the kernel)"
    if tuple(facts.kernel_args[: len(KERNEL_ARGS)]) != KERNEL_ARGS or not set(KERNEL_KEYWORDS) <= set(facts.kernel_args):
        return "paged", (
            f"JAX {facts.jax} has no ragged paged attention kernel with combined K/V pages at {KERNEL} "
            f"({JAX_EXTRA} installs JAX{JAX_RANGE}, which has it)"
        )
    if not facts.jax_op:
        return "paged", "this torch_tpu has no torch.tpu.pallas.jax_op to call a JAX kernel from a compiled step"
    if facts.attention_sinks:
        return "paged", "attention sinks (the kernel has none)"
    if facts.kv_cache is not None:
        return "paged", (
            f"the {facts.kv_cache} KV cache (the kernel's k_scale/v_scale are one static float per cache; "
            "the int8 cache keeps a scale per position and head)"
        )
    if facts.dtype not in DTYPES:
        return "paged", f"the model computes in {facts.dtype} (the kernel path runs float32 or bfloat16)"
    if facts.head_dim % HEAD_ALIGNMENT:
        return "paged", f"head size {facts.head_dim} (the kernel takes multiples of {HEAD_ALIGNMENT})"
    if not facts.kv_heads or facts.heads % facts.kv_heads:
        return "paged", f"{facts.heads} query heads for {facts.kv_heads} key-value heads"
    if not heads_tile(facts.kv_heads, DTYPES[facts.dtype]):
        return "paged", f"{facts.kv_heads} key-value heads in {facts.dtype} (the kernel cannot tile them)"
    return "ragged", f"JAX {facts.jax} ragged paged attention through torch.tpu.pallas.jax_op"


def held_kv_bytes(kv_lens: Sequence[int], bytes_per_token: int) -> int:
    """K/V bytes the scheduled requests hold: their tokens (cached and new) times one token's keys
    and values (all key-value heads, one layer)."""
    return sum(int(n) for n in kv_lens) * bytes_per_token


def kernel_kv_bytes(kv_lens: Sequence[int], page_size: int, bytes_per_token: int) -> int:
    """K/V bytes the kernel reads for one layer: the pages holding each sequence's ``kv_len``."""
    return sum(-(-int(n) // page_size) for n in kv_lens) * page_size * bytes_per_token


def gathered_kv_bytes(padded_tokens: int, max_len_keys: int, bytes_per_token: int) -> int:
    """K/V bytes the present path gathers for one layer: each scheduled (padded) token reads its
    request's whole block table (``max_len_keys`` = pages per request x page size)."""
    return padded_tokens * max_len_keys * bytes_per_token


# -------------------------------------------------------------------------------------------------
# docs/serving.md's table, computed from the predicate (scripts/gen_docs_tables.py writes it).

BEGIN = "<!-- generated: transformers_tpu_ext.serving.kernel_path.path_table() -->"
END = "<!-- end of generated table -->"

_KERNEL_ARGS = (*KERNEL_ARGS, *KERNEL_KEYWORDS)
_TAKEN = KernelFacts(jax="0.10.2", kernel_args=_KERNEL_ARGS, jax_op=True, head_dim=128, heads=32, kv_heads=8, dtype="bfloat16")
_CASES: tuple[tuple[str, dict], ...] = (
    ("Llama 3 / Qwen3 shape: head size 128, 8 key-value heads, bf16, JAX 0.10 installed", {}),
    ("the same, sliding-window or soft-capped layers (Mistral, Gemma 2/3 with head size 256)", {"head_dim": 256}),
    ("`TRANSFORMERS_TPU_EXT_SERVE_ATTENTION=paged`", {"setting": "paged"}),
    ("JAX not installed", {"jax": None}),
    ("a JAX without the kernel (or with its first, separate K/V page layout)", {"kernel_args": ()}),
    ("a torch_tpu without `torch.tpu.pallas.jax_op`", {"jax_op": False}),
    ("head size 64 (Llama 3.2 1B, Qwen2.5 0.5B)", {"head_dim": 64}),
    ("3 key-value heads in bf16", {"heads": 24, "kv_heads": 3}),
    ("float16 weights", {"dtype": "float16"}),
    ("the int8 KV cache (`TRANSFORMERS_TPU_EXT_SERVE_KV_CACHE=int8`)", {"kv_cache": "int8"}),
)


def path_table() -> str:
    """The markdown table of :func:`attention_path` over typical models (docs/serving.md)."""
    rows = ["| model and setting | attention of the serving steps | why |", "|---|---|---|"]
    for label, change in _CASES:
        path, why = attention_path(KernelFacts(**{**_TAKEN.__dict__, **change}))
        name = "JAX ragged paged attention kernel" if path == "ragged" else "plain-PyTorch paged attention"
        rows.append(f"| {label} | {name} | {why} |")
    return "\n".join(rows)
