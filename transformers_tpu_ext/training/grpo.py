"""TRL's ``GRPOTrainer`` at static shapes: which runs are padded, and to what lengths (pure).

``GRPOTrainer`` builds its training batches itself, not through a collator: after ``generate()`` it
left-pads the prompts and right-pads the completions to the longest of the generation batch (TRL's
``pad``), so every new prompt + completion length compiles a new forward, backward and loss on a
TPU, and the ops that follow ``generate()`` compile once per generated length. The
``trl_grpo`` patch pads the same tensors further, where :func:`grpo_path` proves the result unchanged:

- **Prompts** (``prompt_ids``, ``prompt_mask``, and the prompts handed to ``generate()``): more left
  padding, attention 0, to a rung of the training ladder (:func:`prompt_length`, the planner's
  :func:`~transformers_tpu_ext.training.buckets.choose_length`). TRL's forward passes no
  ``position_ids``, so every real token's position moves by the padding added: only a model whose
  positions enter as rotary embeddings with fixed frequencies (attention reads ``m - n`` only) gives the
  same result; a rotary type that reads the length (``dynamic``, ``longrope``), or none at all
  (absolute position tables), is left alone.
- **Completions** (``completion_ids``, ``completion_mask``): right padding, mask 0, to
  ``max_completion_length`` (rounded up to ``pad_to_multiple_of``): one shape for the whole run.
  Every loss type of TRL 1.16 (``grpo``, ``bnpo``, ``dr_grpo``, ``dapo``, ``cispo``, ``sapo``,
  ``luspo``, ``vespo``) sums its per-token terms times that mask and divides by a count of the mask,
  a constant (``dr_grpo``: ``max_completion_length``) or ``num_items_in_batch`` (the mask's sum); the
  KL term, importance sampling (token or sequence), the entropy bonus and the logged metrics
  (``kl``, ``entropy``, ``clip_ratio/*``) are masked the same way; the fused LM head scores the
  padding as label -100 (0). ``logits_to_keep`` is the padded completion length, so the prompt
  columns scored are exactly those of the unpadded run. No row is added (rewards are grouped by row).
- **``generate()``** is asked for the static cache when no cache was asked for (TRL's generation config
  says ``disable_compile=True``, which alone keeps Transformers' dynamic cache: a program per decode
  length): the plugin's ``generate()`` then pads the prompts to its buckets and decodes at static
  shapes, token-identical (docs/generation.md), still eager. ``GRPOConfig(cache_implementation=...)``
  is respected.
- **``generate()``'s output** is returned ``max_completion_length`` columns long, the pad token after a
  stop: TRL keeps each completion up to its first end-of-sequence token, so the columns after it are
  never read. Exact only when every stop is a token TRL cuts at: the generation config's
  ``eos_token_id`` among TRL's, no ``stop_strings``, no ``max_time``.

Anything else stays upstream's, said once: vLLM, continuous batching or a ``rollout_func`` (the
completions do not come from ``generate()``), tools and environments, vision-language models, MoE
auxiliary losses, ``top_entropy_quantile < 1`` (its quantile runs over a count of tokens), and TRL's
loss as :func:`~transformers_tpu_ext.training.losses.library_loss` reads it (a ``compute_loss_func``,
Liger kernels, a TRL outside the versions read). Plain data in, plain data out: no torch, no TRL.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

from ..core.length_readers import ModelLengths
from ..ladders import round_up
from .buckets import choose_length
from .losses import LibraryLoss

__all__ = ["GRPOFacts", "GRPOPlan", "grpo_path", "prompt_length", "GENERATION_SOURCES"]

#: Where GRPO's completions come from: ``generate`` (TRL's "regular generation path", through the
#: plugin's ``generate()``), ``vllm``, ``continuous_batching`` (``generate_batch``), ``rollout_func``.
GENERATION_SOURCES = ("generate", "vllm", "continuous_batching", "rollout_func")


_SOURCES = {"vllm": "vLLM", "continuous_batching": "continuous batching (generate_batch)", "rollout_func": "a rollout_func"}


@dataclass(frozen=True)
class GRPOFacts:
    """What the padding of a ``GRPOTrainer``'s batches depends on (read off the trainer by the glue).

    ``loss``: :func:`~transformers_tpu_ext.training.losses.library_loss` of the trainer (its loss
    type, TRL's version, a ``compute_loss_func``, Liger); ``generation``: one of
    :data:`GENERATION_SOURCES`; ``tools``: tools or environments (multi-turn completions);
    ``vision``: a vision-language model (images, per-token ``token_type_ids``); ``aux_loss``: an MoE
    load-balancing loss; ``top_entropy_quantile``; ``stop_tokens``: the generation config's
    end-of-sequence ids are all among TRL's (``eos_token_ids``); ``other_stops``: other reasons
    ``generate()`` stops (``stop_strings``, ``max_time``); ``max_completion_length``: the most tokens
    ``generate()`` makes (its config's ``max_new_tokens``: TRL's ``max_completion_length`` unless
    ``generation_kwargs`` changed it); ``pad_to_multiple_of``; ``causal_lm``: a Transformers causal LM; ``lengths``: its rotary embeddings;
    ``cache_implementation``: the generation config's (``GRPOConfig.cache_implementation``);
    ``position_readers``: what else in the model reads a token's absolute position (Llama 4's
    ``attn_temperature_tuning`` scales the queries of its layers without rotary embeddings by a
    function of the position).
    """

    loss: LibraryLoss | str
    max_completion_length: int | None
    generation: str = "generate"
    tools: bool = False
    vision: bool = False
    aux_loss: bool = False
    top_entropy_quantile: float = 1.0
    stop_tokens: bool = True
    other_stops: tuple[str, ...] = ()
    pad_to_multiple_of: int | None = None
    causal_lm: bool = True
    lengths: ModelLengths = field(default_factory=ModelLengths)
    cache_implementation: str | None = None
    position_readers: tuple[str, ...] = ()


@dataclass(frozen=True)
class GRPOPlan:
    """How a ``GRPOTrainer``'s batches are padded: prompts to a rung of ``ladder`` (reusing a used rung
    at most ``reuse`` times longer), rounded up to ``multiple``; completions and ``generate()``'s new
    tokens to ``completion_length`` (``max_new_tokens``: what ``generate()`` is asked for);
    ``static_cache``: ``generate()`` is asked for the static cache (TRL asks for no cache and
    ``disable_compile=True``, which the plugin's ``generate()`` leaves to Transformers' dynamic cache,
    a program per generated length)."""

    completion_length: int
    max_new_tokens: int
    ladder: tuple[int, ...]
    reuse: float = 1.5
    multiple: int | None = None
    static_cache: bool = False


def grpo_path(facts: GRPOFacts, *, ladder: Sequence[int], reuse: float = 1.5) -> GRPOPlan | str:
    """The :class:`GRPOPlan` of a ``GRPOTrainer``, or why its batches are left as TRL makes them."""
    if isinstance(facts.loss, str):
        return facts.loss
    if facts.generation != "generate":
        source = _SOURCES.get(facts.generation, facts.generation)
        return f"completions from {source}, not generate(): how they are made and padded was not read"
    if facts.tools:
        return "tools or environments: multi-turn completions (tool_mask) were not read"
    if facts.vision:
        return "a vision-language model: its images and per-token type ids were not read"
    if facts.aux_loss:
        return "an MoE auxiliary loss (output_router_logits): not read"
    if facts.top_entropy_quantile < 1.0:
        return "top_entropy_quantile < 1: its quantile runs over the completion tokens' count (a program per count)"
    if not facts.causal_lm:
        return "not a Transformers causal LM: what its positions read is unknown"
    if facts.lengths.unknown or facts.lengths.readers:
        kinds = ", ".join(facts.lengths.unknown or sorted({r.rope_type for r in facts.lengths.readers}))
        return f"rotary embeddings that read the length ({kinds}): extra prompt padding would change them"
    if facts.position_readers:
        return f"{', '.join(facts.position_readers)} reads absolute positions: extra left padding would change them"
    if not facts.lengths.rotary:
        return "positions without rotary embeddings: extra left padding would move every real token's position"
    if not facts.max_completion_length or facts.max_completion_length < 1:
        return "no max_completion_length: the completions' length has no bound"
    if not facts.stop_tokens:
        return "generate() stops at a token TRL does not cut completions at (generation eos_token_id)"
    if facts.other_stops:
        return f"generate() may stop without an end-of-sequence token ({', '.join(facts.other_stops)})"
    multiple = facts.pad_to_multiple_of if facts.pad_to_multiple_of and facts.pad_to_multiple_of > 1 else None
    length = facts.max_completion_length
    completion = round_up(length, [multiple]) if multiple else length
    return GRPOPlan(completion, length, tuple(ladder), reuse, multiple, static_cache=facts.cache_implementation is None)


def prompt_length(longest: int, plan: GRPOPlan, used: Collection[int]) -> int:
    """The columns of a generation batch's prompts whose longest has ``longest`` tokens: its rung of the
    ladder (or a used rung at most ``plan.reuse`` times longer), rounded up to ``plan.multiple``."""
    target = choose_length(max(longest, 1), plan.ladder, used, plan.reuse)
    return round_up(target, [plan.multiple]) if plan.multiple else target
