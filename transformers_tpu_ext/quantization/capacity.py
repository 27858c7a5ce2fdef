"""Which TPUs hold a model, and how fast it can decode there: pure arithmetic over counts from a config.

:func:`fit` takes a :class:`ModelCounts` (plain ints, made by :func:`transformers_tpu_ext.quantization.runtime.count`
from a config on the meta device, or by hand) and, for each chip generation and chip count that has a
topology (:data:`transformers_tpu_ext.core.topology.TOPOLOGIES`), gives:

- the bytes of weights per chip in the chosen format (bf16, int8, fp8), counted as the quantizers leave
  them: torchao's int8 weight-only and FineGrainedFP8 convert the decoder layers' linear weights; the
  embeddings, the output head and the norms stay in bf16;
- the bytes one position of KV cache adds per chip (bf16, or the plugin's opt-in int8 cache: int8 data
  and one float32 scale per position and key-value head, ``quantization.kv_cache``);
- the placement budget per chip (HBM minus the headroom ``device_map="auto"`` leaves,
  :func:`transformers_tpu_ext.placement.budget.default_headroom`; times 0.9 for torchao, whose quantizer
  keeps that margin): whether the weights fit, and how many cached positions (summed over the batch) the
  rest holds;
- the decode ceiling: HBM bandwidth / bytes read per step. A decode step reads every weight once, and the
  plugin's static and paged caches read the whole cache length (masked): at ``context`` positions and
  ``batch`` rows a step reads ``weights + context x batch x KV bytes per position``. A mixture-of-experts
  model's step reads its routed experts only where some row chose them (the grouped-matmul kernel,
  ``experts.policy``): with ``k`` of ``E`` experts per token and uniform routing (an assumption), the expected
  fraction of experts a batch of ``b`` rows selects is ``1 - (1 - k/E)^b`` (:func:`selected_fraction`); the
  routed experts are sharded over the chips like the other linears (expert parallelism, ``ep_size = chips``).

The ceilings are bounds from bandwidth alone (no compute, no overlap), the numbers a chip cannot beat;
they assume XLA fuses the dequantization into the matmul, so that an 8-bit weight is read as 8 bits
(unmeasured on a chip, see ``docs/quantization.md``).

Chip data (:data:`CHIPS`): HBM per device as torch_tpu 0.2.0 reports it (``get_hbm_bytes_per_device``;
v7: 96 GiB, one of a chip's two devices) and HBM bandwidth per chip from the Cloud TPU documentation
(v7: halved per device, an inference).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from types import MappingProxyType
from typing import Any, Mapping

from ..placement.budget import default_headroom
from ..core.topology import TOPOLOGIES
from . import kv_format as kv_cache

__all__ = [
    "CHIPS",
    "KV_FORMATS",
    "WEIGHT_FORMATS",
    "ChipFit",
    "ChipSpec",
    "FitReport",
    "ModelCounts",
    "fit",
    "format_report",
    "kv_bytes_per_position",
    "kv_heads_per_chip",
    "selected_fraction",
    "weight_bytes",
]

GiB = 1 << 30


@dataclass(frozen=True)
class ChipSpec:
    generation: str
    hbm_bytes: int  # per device (one process)
    bandwidth: float  # HBM bytes per second per device
    source: str
    bf16_flops: float = 0.0  # peak bf16 FLOP/s per device (the published per-chip figure; v7: halved per device)


#: The generations the fit report knows (the plugin's view; the backend's is ``get_device_properties``).
CHIPS: Mapping[str, ChipSpec] = MappingProxyType(
    {
        "v4": ChipSpec("v4", 32 * GiB, 1200e9, "cloud.google.com/tpu/docs/v4: 32 GiB, 1200 GBps, 275 TFLOPs bf16", 275e12),
        "v5e": ChipSpec("v5e", 16 * GiB, 819e9, "cloud.google.com/tpu/docs/v5e: 16 GB, 819 GBps, 197 TFLOPs bf16", 197e12),
        "v5p": ChipSpec("v5p", 95 * GiB, 2765e9, "cloud.google.com/tpu/docs/v5p: 95 GB, 2765 GBps, 459 TFLOPs bf16", 459e12),
        "v6e": ChipSpec("v6e", 32 * GiB, 1638e9, "cloud.google.com/tpu/docs/v6e: 32 GB, 1638 GBps, 918 TFLOPs bf16", 918e12),
        "v7": ChipSpec("v7", 96 * GiB, 7380e9 / 2, "cloud.google.com/tpu/docs/tpu7x: 7380 GBps, 2307 TFLOPs bf16 per chip, 2 devices",
                        2307e12 / 2),
    }
)


@dataclass(frozen=True)
class WeightFormat:
    element: float  # bytes per element of a converted linear weight
    per_row: int  # bytes of scales per output row
    block: tuple[int, int] | None  # scale block (rows, columns), 4-byte scale each
    note: str
    budget_factor: float = 1.0  # the quantizer's adjust_max_memory (torchao keeps 10 % for its scales)


#: Bytes of a converted linear weight: the element, plus its scales.
WEIGHT_FORMATS: Mapping[str, WeightFormat] = MappingProxyType(
    {
        "bf16": WeightFormat(2.0, 0, None, "no quantization"),
        "int8": WeightFormat(1.0, 5, None, "torchao Int8WeightOnlyConfig: int8, a float32 scale and an int8 zero point per row",
                             0.9),
        "fp8": WeightFormat(1.0, 0, (128, 128), "FineGrainedFP8: float8_e4m3fn, one float32 scale per 128x128 block"),
    }
)

#: Bytes of KV cache per position and key-value head, for a head dimension ``d``: data, then scales.
KV_FORMATS: Mapping[str, Any] = MappingProxyType(
    {
        "bf16": lambda d: 2 * d,
        "int8": lambda d: d + kv_cache.SCALE_BYTES,  # the int8 KV cache: int8 data and one float32 scale per position and head
    }
)


@dataclass(frozen=True)
class ModelCounts:
    """A causal LM's parameters by category, and its attention shape (plain ints)."""

    name: str
    linear: int  # elements of the decoder layers' linear weights (what a quantizer converts)
    linear_rows: int  # their output rows (per-row scales)
    linear_blocks: int  # their 128x128 blocks (block scales)
    embeddings: int  # input embeddings (kept bf16)
    head: int  # output head, 0 when tied to the embeddings (kept bf16)
    other: int  # norms, biases, everything else (kept bf16)
    layers: int
    attention_layers: int  # layers with a KV cache
    kv_heads: int
    head_dim: int
    attention_heads: int
    expert_linear: int = 0  # elements of the routed experts' stacks (part of ``linear``)
    experts: int = 0  # routed experts per MoE layer
    experts_per_token: int = 0

    @property
    def parameters(self) -> int:
        return self.linear + self.embeddings + self.head + self.other


@dataclass(frozen=True)
class ChipFit:
    generation: str
    chips: int
    weights_per_chip: int
    kv_bytes_per_position_per_chip: int
    budget_per_chip: int  # HBM - placement headroom
    fits: bool  # the weights are within the placement budget
    kv_positions: int  # cached positions (summed over the batch) the rest of the budget holds
    steps_per_s: float  # decode ceiling with an empty cache: bandwidth / weights per chip (a MoE's selected experts)
    steps_per_s_at_context: float  # ... reading `context` x `batch` cached positions per step
    tokens_per_s_at_context: float  # ... times the batch
    expert_bytes_read_per_chip: int = 0  # routed experts' bytes a decode step reads (expected, uniform routing)


@dataclass(frozen=True)
class FitReport:
    model: str
    weights: str
    kv: str
    weight_bytes: int
    weight_bytes_by_part: dict
    kv_bytes_per_position: int
    context: int
    batch: int
    chips: list = field(default_factory=list)
    experts: tuple = ()  # (routed experts per layer, per token, fraction a decode step reads) of a MoE model

    def asdict(self) -> dict:
        return asdict(self)


def weight_bytes(counts: ModelCounts, weights: str) -> dict[str, int]:
    """Bytes of the model's weights in ``weights`` format, by part (``linear``, ``embeddings``, ``head``, ``other``)."""
    fmt = _format(weights, WEIGHT_FORMATS, "weights")
    linear = counts.linear * fmt.element + counts.linear_rows * fmt.per_row
    if fmt.block is not None:
        linear += counts.linear_blocks * 4
    return {
        "linear": int(linear),
        "embeddings": 2 * counts.embeddings,
        "head": 2 * counts.head,
        "other": 2 * counts.other,
    }


def selected_fraction(counts: ModelCounts, batch: int) -> float:
    """Expected fraction of a MoE layer's routed experts a decode step of ``batch`` rows selects (each row picks
    ``experts_per_token`` of ``experts``, uniformly and independently: an assumption); 1.0 for a dense model."""
    if not counts.experts:
        return 1.0
    return 1.0 - (1.0 - counts.experts_per_token / counts.experts) ** batch


def kv_heads_per_chip(counts: ModelCounts, chips: int) -> int:
    """Key-value heads one chip holds under the plugin's tensor-parallel plans (``parallelism.tp_plans``):
    sharded when ``chips`` divides them, one replicated head when ``chips`` is a multiple of them, else
    the attention is replicated (every head on every chip)."""
    heads = counts.kv_heads
    if chips == 1 or heads % chips == 0:
        return heads // chips
    if chips % heads == 0 and counts.attention_heads % chips == 0:
        return 1
    return heads


def kv_bytes_per_position(counts: ModelCounts, kv: str, kv_heads: int | None = None) -> int:
    """Bytes one cached position adds over all layers (``kv_heads``: per chip; default all of them).

    Sliding-window layers count at full length: the plugin's static and paged caches hold the whole
    history for them (one compiled graph; see docs/generation.md)."""
    per_head = _format(kv, KV_FORMATS, "kv")(counts.head_dim)
    heads = counts.kv_heads if kv_heads is None else kv_heads
    return counts.attention_layers * 2 * heads * per_head


def fit(
    counts: ModelCounts,
    *,
    weights: str = "bf16",
    kv: str = "bf16",
    chips: tuple[int, ...] | None = None,
    generations: tuple[str, ...] | None = None,
    context: int = 4096,
    batch: int = 1,
) -> FitReport:
    """The fit of ``counts`` in ``weights``/``kv`` formats on each generation and chip count (see the module)."""
    if context < 0 or batch < 1:
        raise ValueError(f"context must be >= 0 and batch >= 1, got context={context}, batch={batch}")
    parts = weight_bytes(counts, weights)
    total = sum(parts.values())
    rows = []
    for generation in generations or tuple(CHIPS):
        spec = CHIPS.get(generation)
        if spec is None:
            raise ValueError(f"unknown TPU generation {generation!r}; known: {', '.join(CHIPS)}")
        for n in TOPOLOGIES.get(generation, (1,)):
            if chips is not None and n not in chips:
                continue
            # Tensor parallelism shards the linears, embeddings and head; norms are replicated (small).
            per_chip = math.ceil((total - parts["other"]) / n) + parts["other"]
            kv_position = kv_bytes_per_position(counts, kv, kv_heads_per_chip(counts, n))
            budget = int((spec.hbm_bytes - default_headroom(spec.hbm_bytes)) * WEIGHT_FORMATS[weights].budget_factor)
            positions = max(0, budget - per_chip) // kv_position if kv_position else 0
            linear_bytes = parts["linear"]
            experts = math.ceil(linear_bytes * counts.expert_linear / counts.linear / n) if counts.linear else 0
            experts_read = math.ceil(experts * selected_fraction(counts, batch))
            read = per_chip - experts + experts_read + context * batch * kv_position
            rows.append(
                ChipFit(
                    generation=generation,
                    chips=n,
                    weights_per_chip=per_chip,
                    kv_bytes_per_position_per_chip=kv_position,
                    budget_per_chip=budget,
                    fits=per_chip <= budget,
                    kv_positions=int(positions),
                    steps_per_s=round(spec.bandwidth / (per_chip - experts + experts_read), 1),
                    steps_per_s_at_context=round(spec.bandwidth / read, 1),
                    tokens_per_s_at_context=round(batch * spec.bandwidth / read, 1),
                    expert_bytes_read_per_chip=experts_read,
                )
            )
    experts = (counts.experts, counts.experts_per_token, selected_fraction(counts, batch)) if counts.experts else ()
    return FitReport(counts.name, weights, kv, total, parts, kv_bytes_per_position(counts, kv), context, batch, rows, experts)


def _format(name: str, table: Mapping[str, Any], what: str) -> Any:
    try:
        return table[name]
    except KeyError:
        raise ValueError(f"unknown {what} format {name!r}; choose one of {', '.join(table)}") from None


def _gib(n: float) -> str:
    return f"{n / GiB:.2f} GiB"


def _size(n: float) -> str:
    for unit, scale in (("GiB", GiB), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{int(n)} B"


def _experts_line(report: FitReport) -> list[str]:
    if not report.experts:
        return []
    experts, per_token, fraction = report.experts
    return [f"  mixture of experts: {per_token} of {experts} routed experts per token; a decode step of batch "
            f"{report.batch} reads {fraction:.0%} of them (uniform routing), the experts sharded over the chips"]


def format_report(reports: list[FitReport]) -> str:
    """Plain-text tables of one or more reports (``transformers-tpu doctor --fit``)."""
    lines: list[str] = []
    for report in reports:
        parts = ", ".join(f"{name} {_size(size)}" for name, size in report.weight_bytes_by_part.items() if size)
        lines += [
            f"{report.model}: weights {report.weights} {_size(report.weight_bytes)} ({parts}); "
            f"KV cache {report.kv} {report.kv_bytes_per_position:,} bytes per position; "
            f"decode at {report.context:,} cached positions x batch {report.batch}",
            *_experts_line(report),
            f"  {'chip':<7}{'chips':>6}{'weights/chip':>15}{'budget/chip':>14}  {'fits':<5}{'KV positions':>14}"
            f"{'steps/s (empty)':>17}{'steps/s (context)':>19}{'tokens/s':>10}",
        ]
        for row in report.chips:
            lines.append(
                f"  {row.generation:<7}{row.chips:>6}{_gib(row.weights_per_chip):>15}{_gib(row.budget_per_chip):>14}  "
                f"{'yes' if row.fits else 'no':<5}{row.kv_positions if row.fits else 0:>14,}"
                f"{row.steps_per_s:>17,.1f}{row.steps_per_s_at_context:>19,.1f}{row.tokens_per_s_at_context:>10,.1f}"
            )
        lines.append("")
    lines.append(
        "Ceilings are HBM bandwidth / bytes read per decode step (weights once, plus the cached positions); "
        "8-bit formats assume the dequantization is fused into the matmul (unmeasured on a chip)."
    )
    return "\n".join(lines)
