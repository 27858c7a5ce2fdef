"""State-space and hybrid models in ``generate()`` on TPU: which ones the plugin handles, and how (pure).

Transformers 5.25 keeps a recurrent layer's state in its caches' ``LinearAttentionLayer`` (layer types
``"linear_attention"`` and ``"conv"``; ``"hybrid"`` layers pair one with a full-attention layer): a
convolution state (the last ``kernel`` inputs of the layer's causal convolution) and, for scans, a
recurrent state, both of a fixed shape, written in place. A ``StaticCache`` holds them beside its
full-length attention layers, so the decode step of such a model compiles to one graph per batch
bucket, as an attention model's does. What padding does to them depends on each family's mixer, and
that is what :func:`recurrent_path` decides, from plain facts read off the model
(:class:`RecurrentFacts`) and one entry per family (:data:`FAMILIES`):

- **Left padding of the prompt** is invisible where the mixer zeroes the padding positions before its
  input projection and again after its convolution, and nothing turns those zeros into something
  else: a bias on the input projection would (the convolution of the first real tokens would read
  it where an unpadded prompt reads the convolution's own zeros). Then a padding position feeds the
  scan ``B = C = x = 0`` (Mamba, Mamba2, Jamba, Falcon-H1) or ``q = k = v = 0`` (Qwen3-Next's
  gated delta rule): the state starts the first real token at zero, as without padding; the
  convolution state keeps zeros where upstream pads with zeros. (Equal in exact arithmetic; the
  scans' chunking sees the tokens at other offsets, as a padded attention sees other columns.)
- **The prefill in chunks** (the plugin's compiled prefill, 64 tokens a piece) needs a mixer whose
  multi-token forward continues from the cache: Mamba's and Jamba's selective scan restarts from a
  zero state whatever the cache holds (Transformers 5.25's own TODO in ``mamba_scan_forward``), so
  their prompt is prefilled in one piece, padded to a rung of :func:`whole_prompt_ladder`.
- **Positions**: Mamba and Mamba2 read none; the hybrids' attention layers take the position ids
  computed from the attention mask, as an attention model's do.
- **The 4D masks built on the device** (``policy.mask_path``) hold only for single-token forwards:
  the recurrent layers read the 2D mask sliced to the forward's tokens
  (``create_recurrent_attention_mask``), which the cache-long device mask is not; a decode step
  reads no recurrent mask at all.

A family whose padding is not proven invisible (a bias on the projection) still gets the static
cache and its compiled decode step, with the batch rounded to a bucket (rows are independent) but
its prompt unpadded and prefilled as Transformers does. A model with recurrent layers of any other
family is Transformers' call, untouched, named once at WARNING. ``docs/generation.md`` ("State-space
and hybrid models") shows the table :func:`family_table` renders from these decisions.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..ladders import geometric_ladder

__all__ = [
    "FAMILIES",
    "RECURRENT_LAYER_TYPES",
    "Family",
    "RecurrentFacts",
    "RecurrentPath",
    "device_mask_holds",
    "family_table",
    "recurrent_path",
    "whole_prompt_ladder",
]

#: Where the docs explain these models (the WARNING of a call left to upstream points there).
DOCS = "docs/generation.md#state-space-and-hybrid-models"
#: The markers around the generated table in docs/generation.md.
BEGIN = "<!-- generated: transformers_tpu_ext.generation.recurrent.family_table() -->"
END = "<!-- end of generated state-space and hybrid family table -->"

#: Layer types (``config.layer_types`` as Transformers' caches read them) whose cache layer holds a
#: recurrent state (``LinearAttentionLayer``; ``"hybrid"``: with a full-attention layer beside it).
RECURRENT_LAYER_TYPES = frozenset({"linear_attention", "conv", "hybrid"})
#: The attention layer types a handled hybrid may have besides (the static cache's full-length layers).
ATTENTION_LAYER_TYPES = frozenset({"full_attention"})


@dataclass(frozen=True)
class Family:
    """What the plugin knows of one family's recurrent mixer (Transformers 5.25's code)."""

    name: str  # for messages and the docs
    mixer: str  # the mixer's class name in ``transformers.models.<model_type>``
    #: The config field of a bias on the mixer's input projection (padding visible when true), or ``None``.
    bias: str | None
    #: A multi-token forward continues from a non-empty cache (the prefill may be chunked).
    continues: bool
    #: The model reads positions (``position_ids``: rotary embeddings, attention masks).
    positions: bool
    #: What the mixer is, for the docs.
    what: str
    #: Why left padding is invisible to it (without the bias).
    padding: str = "padding zeroed before the input projection and after the convolution: the scan sees x = B = C = 0 there"


#: The families whose mixers the predicate knows, by ``config.model_type``.
FAMILIES: dict[str, Family] = {
    "mamba": Family("Mamba", "MambaMixer", "use_bias", False, False, "selective scan"),
    "mamba2": Family("Mamba2", "Mamba2Mixer", "use_bias", True, False, "state space duality (chunked scan)"),
    "jamba": Family("Jamba", "JambaMambaMixer", "mamba_proj_bias", False, True, "Mamba scan + attention + MoE"),
    "falcon_h1": Family("Falcon-H1", "FalconH1Mixer", "mamba_proj_bias", True, True, "Mamba2 beside attention in every layer"),
    "lfm2": Family("LFM2", "Lfm2ShortConv", "conv_bias", True, True, "gated short convolution + attention",
                   "padding zeroed before the input projection: the convolution reads zeros there, as an unpadded prompt's own padding"),
    "qwen3_next": Family("Qwen3-Next", "Qwen3NextGatedDeltaNet", None, True, True, "gated delta rule + attention + MoE",
                         "padding zeroed before the bias-free projections and convolution: q = k = v = 0 there"),
}


@dataclass(frozen=True)
class RecurrentFacts:
    """What the glue reads off a model for :func:`recurrent_path` (plain data)."""

    model_type: str
    layer_types: tuple[str, ...]  # its text layers, as its caches see them
    #: Class names of the model's modules defined by Transformers' own modeling file of ``model_type``.
    upstream_modules: tuple[str, ...] = ()
    #: The value of the family's bias field (``Family.bias``), ``None`` if the family has none.
    bias: bool | None = None
    accepts_position_ids: bool = True
    accepts_attention_mask: bool = True


@dataclass(frozen=True)
class RecurrentPath:
    """What a model with recurrent layers gets (``handled=False``: Transformers' call, untouched)."""

    handled: bool
    reason: str
    family: str = ""
    pad_prompt: bool = False  # left padding of the prompt to a bucket is invisible
    chunked_prefill: bool = False  # the prompt may be prefilled in chunks (else in one piece)
    positions: bool = True  # the model reads position ids
    attention: bool = True  # it has attention layers besides (a hybrid); else every layer is recurrent


def recurrent_path(facts: RecurrentFacts) -> RecurrentPath | None:
    """The path of a model with recurrent layers; ``None`` for a model without any (not this module's)."""
    types = set(facts.layer_types)
    if not types & RECURRENT_LAYER_TYPES:
        return None
    family = FAMILIES.get(facts.model_type)
    if family is None:
        return RecurrentPath(False, f"{facts.model_type} has recurrent layers of a family the plugin has no proof for")
    other = sorted(types - RECURRENT_LAYER_TYPES - ATTENTION_LAYER_TYPES - {"dummy"})
    if other:
        return RecurrentPath(False, f"{family.name} with {', '.join(other)} layers (not a static cache's full-length layers)")
    if family.mixer not in facts.upstream_modules:
        return RecurrentPath(False, f"{family.name} without Transformers' own {family.mixer} (remote or replaced code)")
    if not facts.accepts_attention_mask:
        return RecurrentPath(False, f"{family.name} whose forward takes no attention mask")
    if family.positions and not facts.accepts_position_ids:
        return RecurrentPath(False, f"{family.name} whose forward takes no position ids")
    chunks = family.continues
    common = dict(chunked_prefill=chunks, positions=family.positions, attention=bool(types - {"linear_attention", "conv", "dummy"}))
    if family.bias is not None and facts.bias is not False:
        why = (
            f"{family.name}: static recurrent state, decode compiled; prompt not padded "
            f"({family.bias}=True: the projection's bias on padding positions reaches the real tokens' convolution)"
        )
        return RecurrentPath(True, why, family.name, pad_prompt=False, **common)
    prefill = "in chunks" if chunks else "in one piece (its scan restarts from zero on a multi-token forward)"
    why = f"{family.name}: static recurrent state, prompt padded ({family.padding}), prefill {prefill}"
    return RecurrentPath(True, why, family.name, pad_prompt=True, **common)


def device_mask_holds(path: RecurrentPath | None, tokens: int) -> bool:
    """Whether a forward of ``tokens`` tokens may take the call's cache-long 2D device mask (``policy.mask_path``).

    Always without recurrent layers. With them, only a decode step: their mask is the 2D mask sliced to
    the forward's last tokens (``create_recurrent_attention_mask``), which a cache-long mask gets wrong
    for a prompt (it would unmask the padding); a one-token forward reads no recurrent mask at all.
    """
    return path is None or tokens == 1


def whole_prompt_ladder(steps_per_octave: int = 1, top: int = 1 << 20) -> tuple[int, ...]:
    """The prompt rungs of a model prefilled in one piece: multiples of 16 from 16, ``steps_per_octave`` a doubling."""
    return geometric_ladder(16, top, steps_per_octave, 16)


def family_table() -> str:
    """The markdown table of docs/generation.md ("State-space and hybrid models"), from :func:`recurrent_path`."""
    lines = [
        "| family (`model_type`) | recurrent layers | prompt padded to buckets | prefill | position ids | why |",
        "|---|---|---|---|---|---|",
    ]
    for model_type, family in FAMILIES.items():
        for bias in ((False, True) if family.bias else (None,)):
            facts = RecurrentFacts(model_type, ("linear_attention",), (family.mixer,), bias=bias)
            path = recurrent_path(facts)
            name = f"{family.name} (`{model_type}`)" + (f", `{family.bias}={bias}`" if family.bias else "")
            prefill = "in chunks of the bucket" if path.chunked_prefill else "in one piece"
            if not path.pad_prompt:
                prefill = "as Transformers does (uncompiled)"
            lines.append(
                f"| {name} | {family.what} | {'yes' if path.pad_prompt else 'no (batch only)'} | {prefill} | "
                f"{'from the attention mask' if path.positions else 'none read'} | {path.reason} |"
            )
    lines.append(
        "| any other model with `linear_attention`, `conv` or `hybrid` layers (Zamba, Bamba, Falcon-Mamba, ...) | — | — | — | — | "
        f"{recurrent_path(RecurrentFacts('zamba2', ('linear_attention',))).reason}: Transformers', untouched (one WARNING) |"
    )
    return "\n".join(lines)
