"""Which mixture-of-experts layers run their experts through the grouped-matmul kernel on TPU, and how it is
tiled: plain functions over plain data (no torch, no Transformers, no JAX).

Transformers 5.25 computes a MoE layer's experts through its experts interface
(``transformers.integrations.moe.ALL_EXPERTS_FUNCTIONS``, chosen by ``config._experts_implementation``;
``"grouped_mm"`` by default). On TPU its ``grouped_mm`` sorts the (token, expert) pairs, counts them per expert
with ``torch.histc`` on int32 ids and calls ``torch.nn.functional.grouped_mm``, which torch-tpu 0.2.0 lowers to
XLA's ``chlo.ragged_dot`` (its source mirror, ``grouped_mm_aten_kernels.cc``): correct on a chip (both ops are
registered, the simulated TPU runs them as the chip does), but what XLA's TPU compiler reads for it is not
public. On the kernel path (:func:`experts_path`) the experts run through **JAX's megablox grouped matmul**
(``jax.experimental.pallas.ops.tpu.megablox``: ``gmm`` forward, ``gmm`` with the other transposition and ``tgmm``
backward; the kernel MaxText trains MoE models with) called through ``torch.tpu.pallas.jax_op``. Its reads are
known from its source: each grid step loads the ``[tk, tn]`` weight block of the expert owning the current
``tm`` rows, so a step of few tokens (one ``tm`` tile: a decode step) reads each *selected* expert's weights
once and no other expert's, and a prefill reads each expert whose rows it holds once per row tile it touches.

The kernel's constraints, read from ``gmm.py`` and Pallas' TPU lowering (what the simulated TPU checks by
lowering the call for a chip): ``lhs [m, k]`` and ``rhs [groups, k, n]`` (or ``[groups, n, k]``,
``transpose_rhs``) in float32 or bfloat16, int32 group sizes, ``m`` divisible by the row tile ``tm``, and block
shapes whose last two dimensions divide by (8, 128) or equal the array's (:func:`tiling`).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "ExpertsFacts", "KERNEL", "KERNEL_DTYPES", "ROW_TILE", "decode_switch", "experts_path", "padded_rows", "path_table",
    "tiling",
]

#: The kernel's module (JAX >= 0.4.30; the ``jax`` extra installs JAX 0.10).
KERNEL = "jax.experimental.pallas.ops.tpu.megablox.gmm"
#: What the kernel multiplies (``megablox.common.assert_is_supported_dtype``).
KERNEL_DTYPES = ("float32", "bfloat16")
#: Rows one tile covers when a call holds more than :data:`SINGLE_TILE_ROWS` (the kernel's default ``tm``).
ROW_TILE = 128
#: Up to this many (token, expert) rows, one row tile covers them all: each selected expert is read once.
SINGLE_TILE_ROWS = 512
#: Largest tile of the contracted and output dimensions (a multiple of 128, as Pallas' TPU blocks need).
COLUMN_TILE = 512


@dataclass(frozen=True)
class ExpertsFacts:
    """What the dispatcher reads off one experts call (plain data)."""

    tpu: bool = True  # the hidden states are on a TPU
    dtype: str = "bfloat16"  # the experts' weights
    has_gate: bool = True
    gate_layout: str = "concatenated"  # "concatenated" ([gate; up]) or "interleaved" (gpt-oss), applied by the module
    has_bias: bool = False
    transposed: bool = False  # weights [experts, in, out] (gpt-oss) rather than [experts, out, in]
    expert_parallel: bool = False  # local experts of an expert-parallel plan (ids past them are other ranks')
    distributed_weights: bool = False  # the weights are DTensors (FSDP, a tensor-parallel plan sharding them)
    jax: str | None = None  # the installed JAX version, or None
    kernel: bool = False  # the megablox module imports
    jax_op: bool = False  # torch.tpu.pallas.jax_op exists


def experts_path(facts: ExpertsFacts) -> tuple[str, str]:
    """``("gmm", why)`` if the experts run through JAX's megablox grouped matmul, else ``("upstream", why)``:
    Transformers' own ``grouped_mm`` (on a TPU: torch-tpu's ``_grouped_mm``), untouched.

    Safe when the call is on a TPU, its weights are float32 or bfloat16 (the kernel's types; it accumulates in
    float32 as ``grouped_mm`` does), JAX with the kernel and torch-tpu's ``jax_op`` are installed. Biases, either
    gate layout, transposed weights, a post-expert norm and expert-parallel sentinels (routes to other ranks'
    experts: no rows, zero output) are applied around the kernel exactly as upstream applies them.
    """
    if not facts.tpu:
        return "upstream", "not on a TPU"
    if facts.distributed_weights:
        return "upstream", "the experts' weights are DTensors (FSDP or a plan sharding them inside an expert)"
    if facts.dtype not in KERNEL_DTYPES:
        return "upstream", f"{facts.dtype} weights (the kernel multiplies float32 or bfloat16)"
    if facts.jax is None:
        return "upstream", "JAX is not installed (pip install 'transformers-tpu-ext[jax]' adds the grouped-matmul kernel)"
    if not facts.kernel:
        return "upstream", f"JAX {facts.jax} has no megablox grouped matmul at {KERNEL}"
    if not facts.jax_op:
        return "upstream", "this torch_tpu has no torch.tpu.pallas.jax_op to call a JAX kernel"
    return "gmm", f"JAX {facts.jax} megablox grouped matmul through torch.tpu.pallas.jax_op"


def decode_switch(facts: ExpertsFacts) -> tuple[bool, str]:
    """Whether ``generate()`` switches the model's ``grouped_mm`` experts to ``batched_mm`` for its decode steps,
    as Transformers does on every device but CPU (and MPS): ``(True, why)`` leaves upstream's switch, ``(False,
    why)`` keeps ``grouped_mm``, that is the kernel, through decode.

    Transformers switches because a decode step's few rows make a grouped matmul slow on GPUs; ``batched_mm``
    then copies each selected expert's weights once per (token, expert) pair. On the kernel path a decode step's
    rows fit one row tile, which reads each selected expert's weights once: keep it (``facts`` of the model's
    experts, on the model's device).
    """
    path, why = experts_path(facts)
    if path != "gmm":
        return True, f"Transformers' switch to batched_mm for decoding ({why})"
    return False, "grouped_mm kept for decoding: a decode step reads each selected expert's weights once"


def padded_rows(rows: int) -> int:
    """The rows a kernel call gets for ``rows`` (token, expert) pairs: a multiple of its row tile (8 up to
    :data:`SINGLE_TILE_ROWS`, then :data:`ROW_TILE`). The padding rows belong to no expert: never computed."""
    rows = max(rows, 1)
    step = 8 if rows <= SINGLE_TILE_ROWS else ROW_TILE
    return -(-rows // step) * step


def tiling(m: int, k: int, n: int) -> tuple[int, int, int]:
    """``(tm, tk, tn)`` for a call of ``m`` rows (:func:`padded_rows`), ``k`` contracted and ``n`` output columns.

    One row tile up to :data:`SINGLE_TILE_ROWS` rows (a decode step reads each selected expert once), else
    :data:`ROW_TILE`; a column dimension up to :data:`COLUMN_TILE` is one block (its full size), a larger one
    blocks of :data:`COLUMN_TILE` (the kernel masks the remainder).
    """
    if m != padded_rows(m):
        raise ValueError(f"{m} rows: pad them to {padded_rows(m)} (padded_rows)")
    tm = m if m <= SINGLE_TILE_ROWS else ROW_TILE
    return tm, min(k, COLUMN_TILE), min(n, COLUMN_TILE)


_CASES: tuple[tuple[str, ExpertsFacts], ...] = (
    ("Mixtral / Qwen3-MoE / DeepSeek-V3 in bf16, JAX 0.10 installed", ExpertsFacts(jax="0.10.2", kernel=True, jax_op=True)),
    ("gpt-oss (biases, interleaved gate, transposed weights)",
     ExpertsFacts(jax="0.10.2", kernel=True, jax_op=True, has_bias=True, gate_layout="interleaved", transposed=True)),
    ("an expert-parallel plan (`DistributedConfig(ep_size=N)`)", ExpertsFacts(jax="0.10.2", kernel=True, jax_op=True,
                                                                             expert_parallel=True)),
    ("JAX not installed", ExpertsFacts()),
    ("float16 weights", ExpertsFacts(dtype="float16", jax="0.10.2", kernel=True, jax_op=True)),
    ("a torch_tpu without `torch.tpu.pallas.jax_op`", ExpertsFacts(jax="0.10.2", kernel=True)),
    ("off TPU (CPU, GPU)", ExpertsFacts(tpu=False, jax="0.10.2", kernel=True, jax_op=True)),
)

BEGIN = "<!-- generated: transformers_tpu_ext.experts.policy.path_table() -->"
END = "<!-- end of generated table -->"


def path_table() -> str:
    """docs/mixture-of-experts.md's table, computed from :func:`experts_path`."""
    names = {"gmm": "JAX megablox grouped matmul (`gmm` / `tgmm`)", "upstream": "Transformers' `grouped_mm`, untouched"}
    rows = ["| experts call (`experts_implementation=\"grouped_mm\"`, the default) | experts computed by | why |",
            "|---|---|---|"]
    for label, facts in _CASES:
        path, why = experts_path(facts)
        rows.append(f"| {label} | {names[path]} | {why} |")
    return "\n".join(rows)
