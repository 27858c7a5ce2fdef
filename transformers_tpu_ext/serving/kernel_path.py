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
    "KernelVariant",
    "attention_path",
    "block_sizes",
    "gathered_kv_bytes",
    "heads_tile",
    "held_kv_bytes",
    "kernel_kv_bytes",
    "lane_packing",
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
#: The head size the kernel takes: TPU lanes. A head size dividing it is lane-packed (see lane_packing).
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


@dataclass(frozen=True)
class KernelVariant:
    """What one registered kernel op is made for (``serving.kernel_call.make``): the rest (scale, sliding
    window, soft cap) are static arguments of the op, its block sizes follow the traced shapes."""

    generation: str = "v6e"  # the chip generation (its block sizes)
    lanes: int = 1  # key-value heads per 128-lane row (lane_packing)
    int8: bool = False  # int8 pages, per-head scales applied outside the kernel

    @property
    def key(self) -> str:
        return f"{self.generation}_l{self.lanes}{'_int8' if self.int8 else ''}"


def lane_packing(head_dim: int, kv_heads: int) -> int:
    """Key-value heads the kernel's cache keeps side by side in one 128-lane row: 1 for head sizes that are
    multiples of 128; ``128 // head_dim`` for sizes dividing 128 (64: two heads per row, no padding) when
    the key-value heads group evenly; 0 when the kernel cannot take the head size."""
    if head_dim > 0 and head_dim % HEAD_ALIGNMENT == 0:
        return 1
    if head_dim > 0 and HEAD_ALIGNMENT % head_dim == 0 and kv_heads % (HEAD_ALIGNMENT // head_dim) == 0:
        return HEAD_ALIGNMENT // head_dim
    return 0


#: JAX's device names (``' '.join(device_kind.split()[:2])``, the keys of its tuned table) and TPU versions.
_JAX_DEVICES = {"v4": ("TPU v4", 4), "v5e": ("TPU v5", 5), "v5p": ("TPU v5", 5), "v6e": ("TPU v6", 6), "v7": ("TPU7x", 7)}


def _power_of_2(x: int) -> int:
    return 1 if x <= 1 else 1 << (int(x) - 1).bit_length()


def block_sizes(generation: str, table: dict, key: tuple) -> tuple[int, int]:
    """``(num_kv_pages_per_block, num_queries_per_block)`` for JAX's kernel on a chip of ``generation``,
    from JAX's own tuned ``table`` (``tuned_block_sizes.TUNED_BLOCK_SIZES``), as its
    ``get_tuned_block_sizes`` picks them on that chip: the table's entry for the key rounded as JAX
    rounds it, else JAX's defaults (128 pages and 32 queries; 32 and 32 on v4). ``key``: (q dtype, kv
    dtype, query heads per block, kv heads per block, head dim, page size, tokens, pages per sequence).

    The kernel left alone asks ``jax.devices()`` for the chip, which inside torch_tpu's process is no
    TPU; the plugin knows the chip from torch_tpu and passes the sizes.
    """
    q_dtype, kv_dtype, q_heads, kv_heads, head_dim, page_size, tokens, pages_per_seq = key
    device, version = _JAX_DEVICES.get(generation, ("TPU v6", 6))
    simplified = (
        q_dtype, kv_dtype, _power_of_2(q_heads), _power_of_2(kv_heads), -(-head_dim // 128) * 128,
        _power_of_2(page_size), _power_of_2(tokens), _power_of_2(page_size * pages_per_seq),
    )
    pages, queries = (32, 32) if version == 4 else table.get(device, {}).get(simplified, (128, 32))
    return min(pages_per_seq, pages), min(tokens, queries)


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
    kernel arguments), grouped-query heads; with no attention sinks (the kernel has none), pages in
    the model's float dtype or int8 pages with a scale per layer and key-value head (applied to the
    queries and the output, outside the kernel). The kernel must exist in the installed JAX with the
    combined K/V page layout, torch_tpu must offer ``jax_op``, and the head size (a multiple of 128,
    or a divisor of 128 lane-packed: ``lane_packing``) and head count must be ones the kernel tiles.
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
    if facts.kv_cache not in (None, "int8"):
        return "paged", f"the {facts.kv_cache} KV cache"
    if facts.dtype not in DTYPES:
        return "paged", f"the model computes in {facts.dtype} (the kernel path runs float32 or bfloat16)"
    if not facts.kv_heads or facts.heads % facts.kv_heads:
        return "paged", f"{facts.heads} query heads for {facts.kv_heads} key-value heads"
    lanes = lane_packing(facts.head_dim, facts.kv_heads)
    if not lanes and facts.head_dim % HEAD_ALIGNMENT and HEAD_ALIGNMENT % facts.head_dim:
        padded = -(-facts.head_dim // HEAD_ALIGNMENT) * HEAD_ALIGNMENT
        return "paged", (
            f"head size {facts.head_dim} (the kernel takes multiples of {HEAD_ALIGNMENT}, or divisors of {HEAD_ALIGNMENT} "
            f"lane-packed; pages padded to {padded} lanes would hold and read {padded / facts.head_dim - 1:.0%} more bytes "
            "than the plain-PyTorch path's own, and JAX 0.10's kernel takes no other size)"
        )
    if not lanes:
        return "paged", (
            f"head size {facts.head_dim} with {facts.kv_heads} key-value heads (the kernel takes multiples of "
            f"{HEAD_ALIGNMENT}, or divisors of {HEAD_ALIGNMENT} with key-value heads grouping by {HEAD_ALIGNMENT} lanes)"
        )
    pages = "int8" if facts.kv_cache == "int8" else facts.dtype
    itemsize = 1 if pages == "int8" else DTYPES[facts.dtype]
    if not heads_tile(facts.kv_heads // lanes, itemsize):
        return "paged", f"{facts.kv_heads} key-value heads of size {facts.head_dim} in {pages} pages (the kernel cannot tile them)"
    packed = f", {lanes} heads per 128 lanes" if lanes > 1 else ""
    return "ragged", f"JAX {facts.jax} ragged paged attention through torch.tpu.pallas.jax_op ({pages} pages{packed})"


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
    ("head size 64, 8 key-value heads (Llama 3.2 1B; Qwen2.5 0.5B has 2)", {"head_dim": 64}),
    ("the int8 KV cache (`TRANSFORMERS_TPU_EXT_SERVE_KV_CACHE=int8`), head size 128 or 64", {"kv_cache": "int8"}),
    ("head size 96 (Phi-3 mini)", {"head_dim": 96}),
    ("head size 80", {"head_dim": 80}),
    ("head size 64 with an odd number of key-value heads (3)", {"head_dim": 64, "heads": 12, "kv_heads": 3}),
    ("3 key-value heads in bf16", {"heads": 24, "kv_heads": 3}),
    ("float16 weights", {"dtype": "float16"}),
    ("attention sinks (gpt-oss; its manager itself runs unpatched, above)", {"attention_sinks": True}),
)


def path_table() -> str:
    """The markdown table of :func:`attention_path` over typical models (docs/serving.md)."""
    rows = ["| model and setting | attention of the serving steps | why |", "|---|---|---|"]
    for label, change in _CASES:
        path, why = attention_path(KernelFacts(**{**_TAKEN.__dict__, **change}))
        name = "JAX ragged paged attention kernel" if path == "ragged" else "plain-PyTorch paged attention"
        rows.append(f"| {label} | {name} | {why} |")
    return "\n".join(rows)
