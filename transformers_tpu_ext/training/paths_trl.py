"""docs/training.md's tables of TRL's trainers: which losses the batch predicate knows, and which
``GRPOTrainer`` runs are padded; rendered from :func:`~transformers_tpu_ext.training.losses.library_loss` and
:func:`~transformers_tpu_ext.training.grpo.grpo_path` (the other tables and the page's rewriting: :mod:`.paths`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from . import buckets as batch_buckets
from . import grpo, losses
from ..core.length_readers import ModelLengths, Rotary

__all__ = ["GRPO_CASES", "LOSS_CASES", "grpo_table", "losses_table"]

_LADDER = batch_buckets.sequence_ladder()


_GRPO_BASE = grpo.GRPOFacts(
    loss=losses.KNOWN_LOSSES["trl.trainer.grpo_trainer.GRPOTrainer"], max_completion_length=256,
    lengths=ModelLengths((Rotary("default"),)),
)

#: TRL ``GRPOTrainer`` runs: what the user configured, and the facts :func:`grpo.grpo_path` reads.
GRPO_CASES: tuple[tuple[str, dict[str, Any]], ...] = (
    ("any `loss_type`, `beta`, `importance_sampling_level`, `entropy_coef`, `mask_truncated_completions`, with or "
     "without `peft_config`; a rotary model (Qwen, Llama, Gemma, Mistral, ...), `max_completion_length=256`", {}),
    ("the same with `pad_to_multiple_of=64`, `max_completion_length=100`", {"pad_to_multiple_of": 64, "max_completion_length": 100}),
    ('`cache_implementation="dynamic"`', {"cache_implementation": "dynamic"}),
    ("`use_vllm=True`", {"generation": "vllm"}),
    ("`use_transformers_continuous_batching=True`", {"generation": "continuous_batching"}),
    ("a `rollout_func`", {"generation": "rollout_func"}),
    ("`tools` or `environment_factory`", {"tools": True}),
    ("a vision-language model", {"vision": True}),
    ("an MoE model with `output_router_logits=True`", {"aux_loss": True}),
    ("`top_entropy_quantile=0.2`", {"top_entropy_quantile": 0.2}),
    ("GPT-2 or another model with a position table", {"lengths": ModelLengths()}),
    ("dynamic NTK RoPE or LongRoPE (Phi-3.5)", {"lengths": ModelLengths((Rotary("longrope", 4096),))}),
    ("Llama 4 (`attn_temperature_tuning`)", {"position_readers": ("Llama 4's attn_temperature_tuning (queries scaled by "
                                                                  "the position in its layers without rotary embeddings)",)}),
    ("TRL 1.17 or later", {"loss": losses.library_loss("trl.trainer.grpo_trainer.GRPOTrainer", version="1.17.0",
                                                       options={"loss_type": "dapo"})}),
    ('`generation_kwargs={"stop_strings": [...]}`', {"other_stops": ("stop_strings",)}),
    ('`generation_kwargs={"eos_token_id": ...}` with ids the tokenizer and model do not end on', {"stop_tokens": False}),
    ("`use_liger_kernel=True` (or a `compute_loss_func`)", {
        "loss": losses.library_loss("trl.trainer.grpo_trainer.GRPOTrainer", version="1.16.0",
                                    options={"loss_type": "dapo", "use_liger_kernel": True})}),
)


def grpo_table(cases: Sequence[tuple[str, dict[str, Any]]] = GRPO_CASES) -> str:
    """The markdown table of which ``GRPOTrainer`` runs are padded on TPU."""
    lines = ["| your `GRPOTrainer` run | on TPU | why |", "|---|---|---|"]
    for what, changes in cases:
        plan = grpo.grpo_path(dataclasses.replace(_GRPO_BASE, **changes), ladder=_LADDER)
        if isinstance(plan, str):
            lines.append(f"| {what} | left as TRL makes it | {plan} |")
            continue
        rungs = ", ".join(str(n) for n in sorted({grpo.prompt_length(n, plan, ()) for n in (1, 17, 33, 49, 65, 97)})) + ", ..."
        cache = "`generate()` with the static cache" if plan.static_cache else "`generate()` with your cache"
        lines.append(
            f"| {what} | prompts padded on the left to {rungs}; completions and `generate()`'s output to "
            f"{plan.completion_length}; {cache} | attention reads only relative positions (rotary, fixed frequencies); "
            "every loss term and metric is masked by `completion_mask` |"
        )
    return "\n".join(lines)


#: Library trainers as users configure them: (what, the class defining the loss, TRL's version, options, compute_loss_func).
LOSS_CASES: tuple[tuple[str, str, str, dict[str, Any], bool], ...] = (
    ("`SFTTrainer`, `loss_type` `\"nll\"` or `\"dft\"`", "trl.trainer.sft_trainer.SFTTrainer", "1.16.0", {"loss_type": "nll"}, False),
    ("`DPOTrainer`, `loss_type` `\"sigmoid\"`, `\"hinge\"`, `\"ipo\"`, `\"sft\"`", "trl.trainer.dpo_trainer.DPOTrainer", "1.16.0",
     {"loss_type": ["sigmoid"]}, False),
    ("`GRPOTrainer`, every `loss_type`", "trl.trainer.grpo_trainer.GRPOTrainer", "1.16.0", {"loss_type": "dapo"}, False),
    ("`RewardTrainer` (`center_rewards_coefficient`, a `margin` column)", "trl.trainer.reward_trainer.RewardTrainer", "1.16.0", {}, False),
    ("`KTOTrainer`, `loss_type` `\"kto\"` or `\"apo_zero_unpaired\"` (also `trl.experimental.kto`)",
     "trl.trainer.kto_trainer.KTOTrainer", "1.16.0", {"loss_type": "kto"}, False),
    ("`trl.experimental` `ORPOTrainer`", "trl.experimental.orpo.orpo_trainer.ORPOTrainer", "1.16.0", {}, False),
    ("`trl.experimental` `CPOTrainer`, `loss_type` `\"sigmoid\"`, `\"hinge\"`, `\"ipo\"`, `\"simpo\"`",
     "trl.experimental.cpo.cpo_trainer.CPOTrainer", "1.16.0", {"loss_type": "simpo"}, False),
    ("`trl.experimental` `GMPOTrainer`", "trl.experimental.gmpo.gmpo_trainer.GMPOTrainer", "1.16.0", {}, False),
    ("`DPOTrainer(loss_type=\"bco_pair\")` (or another type not listed)", "trl.trainer.dpo_trainer.DPOTrainer", "1.16.0",
     {"loss_type": ["bco_pair"]}, False),
    ("`KTOTrainer` or `CPOTrainer` with another `loss_type`", "trl.trainer.kto_trainer.KTOTrainer", "1.16.0",
     {"loss_type": "bco"}, False),
    ("any of them with `use_liger_kernel=True`", "trl.trainer.sft_trainer.SFTTrainer", "1.16.0",
     {"loss_type": "nll", "use_liger_kernel": True}, False),
    ("any of them with a `compute_loss_func`", "trl.trainer.sft_trainer.SFTTrainer", "1.16.0", {"loss_type": "nll"}, True),
    ("`trl.experimental` trainers on TRL 1.17", "trl.experimental.orpo.orpo_trainer.ORPOTrainer", "1.17.0", {}, False),
    ("`RLOOTrainer`, `DistillationTrainer`, `OnlineDPOTrainer`, `GKDTrainer`, ... (not read)", "trl.trainer.rloo_trainer.RLOOTrainer",
     "1.16.0", {}, False),
)


def losses_table(cases: Sequence[tuple[str, str, str, dict[str, Any], bool]] = LOSS_CASES) -> str:
    """The markdown table of which library trainers' losses the batch predicate knows (TRL 1.16)."""
    lines = ["| your TRL trainer | its batches on TPU | what its loss reads |", "|---|---|---|"]
    for what, trainer, version, options, func in cases:
        loss = losses.library_loss(trainer, version=version, options=options, compute_loss_func=func)
        if isinstance(loss, str):
            lines.append(f"| {what} | as collated, said once in the log | {losses.own_loss_reason(loss)} |")
            continue
        cell = "padded to buckets"
        if loss.layout is not None:
            cell += " (its own keys)"
        if loss.counts:
            cell += "; count-shaped metrics on the host"
        lines.append(f"| {what} | {cell} | {loss.reads} |")
    return "\n".join(lines)
