"""What takes which path in training, as ``docs/training.md`` shows it: tables rendered from the predicates.

The cases are plain data (what a user trains, the batch or the optimizer group as made); each row
runs :func:`transformers_tpu_ext.training.buckets.plan_batch` or
:func:`transformers_tpu_ext.training.policy.optimizer_plan` and says what happens on TPU and why.
``docs/training.md`` holds the rendered tables between markers; ``tests/training/test_paths.py``
re-renders them and fails when the page and the code disagree. To rewrite the page::

    python -m transformers_tpu_ext.training.paths docs/training.md
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Callable

from . import buckets as batch_buckets
from . import losses
from .paths_trl import GRPO_CASES, LOSS_CASES, grpo_table, losses_table  # noqa: F401 - re-exported
from . import policy as training_policy
from ..core.length_readers import ModelLengths, Rotary
from .buckets import ModelFacts, SourceFacts

__all__ = ["GRPO_CASES", "LOSS_CASES", "grpo_table", "losses_table", "BATCH_CASES", "OPTIMIZER_CASES", "BatchCase", "OptimizerCase", "batch_table", "optimizer_table", "render", "update"]

_LADDER = batch_buckets.sequence_ladder()
_BATCH = 4

_CAUSAL = ModelFacts(pad_token_id=0, max_positions=40960)
_BERT = ModelFacts(causal=False, pad_token_id=0, max_positions=512)
_BERT_CLASSIFIER = ModelFacts(causal=False, per_token_labels=False, pad_token_id=0, max_positions=512)
_T5 = ModelFacts(causal=False, encoder_decoder=True, pad_token_id=0, max_positions=512, max_decoder_positions=512)
_GPT2_200 = ModelFacts(pad_token_id=0, max_positions=200)
_TRAIN = SourceFacts(training=True)
_EVAL = SourceFacts(training=False, cuts_outputs=True)


def _lm(rows: int, length: int, mask: bool = True) -> dict[str, tuple[int, ...]]:
    shapes = {"input_ids": (rows, length), "labels": (rows, length)}
    if mask:
        shapes["attention_mask"] = (rows, length)
    return shapes


@dataclass(frozen=True)
class BatchCase:
    """A user's batch: what they train, the batch's tensors (shape, dtype), the model and the loop."""

    what: str
    batch: str
    shapes: Mapping[str, tuple[int, ...] | None]
    model: ModelFacts = _CAUSAL
    source: SourceFacts = _TRAIN
    dtypes: Mapping[str, str] = field(default_factory=dict)
    used: tuple[int, ...] = ()  # rungs earlier batches compiled


_REWARD_MODEL = ModelFacts(per_token_labels=False, pools_last_token=True, pad_token_id=0)
_LIBRARY = losses.KNOWN_LOSSES
_DYNAMIC = ModelFacts(pad_token_id=0, max_positions=8192, lengths=ModelLengths((Rotary("dynamic", 8192),)))
_LONGROPE = ModelFacts(
    pad_token_id=0, max_positions=131072, lengths=ModelLengths((Rotary("longrope", 4096),), resets_cache_at=4096)
)

BATCH_CASES: tuple[BatchCase, ...] = (
    BatchCase("causal LM, `DataCollatorForLanguageModeling`", "4 × 70 tokens", _lm(4, 70)),
    BatchCase("causal LM, the last batch of an epoch", "3 × 20 tokens", _lm(3, 20)),
    BatchCase(
        "causal LM, `DataCollatorWithFlattening` (packed)", "1 row of 150 tokens, `position_ids`, no mask",
        {"input_ids": (1, 150), "labels": (1, 150), "position_ids": (1, 150)}, source=SourceFacts(packed=True),
    ),
    BatchCase(
        "packed, `return_seq_idx=True`", "1 row, `position_ids`, `seq_idx`",
        {"input_ids": (1, 150), "labels": (1, 150), "position_ids": (1, 150), "seq_idx": (1, 150)},
        source=SourceFacts(packed=True),
    ),
    BatchCase(
        "GPT-2 with `n_positions=200`", "4 × 195 tokens", _lm(4, 195), model=_GPT2_200,
    ),
    BatchCase("GPT-2 with `n_positions=200`", "4 × 230 tokens", _lm(4, 230), model=_GPT2_200),
    BatchCase(
        "GPT-2 with `n_positions=200`, packed", "1 row of 700 tokens, `position_ids`",
        {"input_ids": (1, 700), "labels": (1, 700), "position_ids": (1, 700)}, model=_GPT2_200, source=SourceFacts(packed=True),
    ),
    BatchCase("BERT MLM, `default_data_collator` on 100-token blocks", "4 × 100, no mask", _lm(4, 100, mask=False), model=_BERT),
    BatchCase(
        "token classification (BERT)", "4 × 40, labels per token",
        {"input_ids": (4, 40), "attention_mask": (4, 40), "labels": (4, 40)}, model=_BERT,
    ),
    BatchCase(
        "sequence classification (BERT), single label", "3 × 40, labels `(3,)`",
        {"input_ids": (3, 40), "attention_mask": (3, 40), "labels": (3,)}, model=_BERT_CLASSIFIER,
    ),
    BatchCase(
        "multi-label classification", "4 × 40, float labels `(4, 3)`",
        {"input_ids": (4, 40), "attention_mask": (4, 40), "labels": (4, 3)}, model=_BERT_CLASSIFIER,
        dtypes={"labels": "float"},
    ),
    BatchCase(
        "decoder-only classifier with `config.pad_token_id`", "4 × 40, labels `(4,)`",
        {"input_ids": (4, 40), "attention_mask": (4, 40), "labels": (4,)},
        model=ModelFacts(per_token_labels=False, pools_last_token=True, pad_token_id=7),
    ),
    BatchCase(
        "decoder-only classifier without a pad token", "1 × 40, labels `(1,)`",
        {"input_ids": (1, 40), "labels": (1,)}, model=ModelFacts(per_token_labels=False, pools_last_token=True),
    ),
    BatchCase(
        "T5, `DataCollatorForSeq2Seq`", "4 × 100 inputs, 4 × 12 labels",
        {"input_ids": (4, 100), "attention_mask": (4, 100), "labels": (4, 12), "decoder_input_ids": (4, 12)}, model=_T5,
    ),
    BatchCase(
        "MoE with `output_router_logits=True`", "3 × 40, no mask", _lm(3, 40, mask=False),
        model=ModelFacts(pad_token_id=0, aux_loss=True, extra_outputs=True),
    ),
    BatchCase("`evaluate()` / `predict()`, causal LM", "3 × 33 tokens", _lm(3, 33), source=_EVAL),
    BatchCase(
        "`evaluate()` of T5, sides in one bucket", "4 × 40 inputs, 4 × 35 labels",
        {"input_ids": (4, 40), "attention_mask": (4, 40), "labels": (4, 35)}, model=_T5, source=_EVAL,
    ),
    BatchCase(
        "`evaluate()` with `include_for_metrics=['inputs']`", "4 × 33 tokens", _lm(4, 33),
        source=SourceFacts(training=False, cuts_outputs=True, returns_inputs=True),
    ),
    BatchCase(
        "`evaluate()` of a Trainer with its own `prediction_step`", "4 × 33 tokens", _lm(4, 33),
        source=SourceFacts(training=False),
    ),
    BatchCase(
        "`Seq2SeqTrainer(predict_with_generate=True)`", "4 × 20 prompts", {"input_ids": (4, 20), "attention_mask": (4, 20)},
        source=SourceFacts(training=False, cuts_outputs=True, generates=True),
    ),
    BatchCase(
        "a Trainer with its own `compute_loss` (or `compute_loss_func`)", "4 × 70 tokens", _lm(4, 70),
        source=SourceFacts(custom_loss=True),
    ),
    BatchCase(
        "TRL `SFTTrainer` (also `completion_only_loss`, `assistant_only_loss`)", "3 × 70 tokens", _lm(3, 70),
        source=SourceFacts(keeps_rows=True),
    ),
    BatchCase(
        "TRL `SFTTrainer(packing=True)` (padding-free rows)", "1 row of 150 tokens, `position_ids`, `seq_idx`, `cu_seq_lens_*`",
        {"input_ids": (1, 150), "labels": (1, 150), "position_ids": (1, 150), "seq_idx": (1, 150),
         "cu_seq_lens_q": (5,), "cu_seq_lens_k": (5,), "max_length_q": None, "max_length_k": None},
        source=SourceFacts(keeps_rows=True),
    ),
    BatchCase(
        "TRL `DPOTrainer`", "3 pairs: 6 × 70 tokens, `completion_mask`",
        {"input_ids": (6, 70), "attention_mask": (6, 70), "completion_mask": (6, 70)}, source=SourceFacts(keeps_rows=True),
    ),
    BatchCase(
        "TRL `RewardTrainer`", "3 pairs: 6 × 70 tokens, `margin` `(3,)`",
        {"input_ids": (6, 70), "attention_mask": (6, 70), "margin": (3,)}, model=_REWARD_MODEL, source=SourceFacts(keeps_rows=True),
        dtypes={"margin": "float"},
    ),
    BatchCase(
        "TRL `KTOTrainer`", "4 × 40 tokens, `completion_mask`; KL completions `KL_*` 4 × 70; `label` `(4,)`",
        {"input_ids": (4, 40), "attention_mask": (4, 40), "completion_mask": (4, 40), "KL_input_ids": (4, 70),
         "KL_attention_mask": (4, 70), "KL_completion_mask": (4, 70), "label": (4,)},
        source=SourceFacts(keeps_rows=True, layout=_LIBRARY["trl.trainer.kto_trainer.KTOTrainer"].layout),
    ),
    BatchCase(
        "TRL `ORPOTrainer`, `CPOTrainer` (`trl.experimental`)", "`chosen_*` 4 × 40, `rejected_*` 4 × 70, `prompt_*` 4 × 20",
        {**{f"{side}_{key}": (4, length) for side, length in (("chosen", 40), ("rejected", 70))
            for key in ("input_ids", "attention_mask", "labels")},
         "prompt_input_ids": (4, 20), "prompt_attention_mask": (4, 20), "prompt": None},
        source=SourceFacts(keeps_rows=True, layout=_LIBRARY["trl.experimental.orpo.orpo_trainer.ORPOTrainer"].layout),
    ),
    BatchCase(
        "your `compute_loss` with `@ignores_padding`", "3 × 70 tokens", _lm(3, 70), source=SourceFacts(),
    ),
    BatchCase(
        "your `compute_loss` with `@ignores_padding(rows=False)`", "3 × 70 tokens", _lm(3, 70), source=SourceFacts(keeps_rows=True),
    ),
    BatchCase(
        "a state-space or hybrid model (Mamba, Mamba2, Jamba, Falcon-H1, LFM2, Qwen3-Next)", "4 × 70 tokens", _lm(4, 70),
        model=ModelFacts(pad_token_id=0),
    ),
    BatchCase(
        "a state-space model of another family (Falcon-Mamba, Zamba, Bamba...)", "4 × 70 tokens", _lm(4, 70),
        model=ModelFacts(pad_token_id=0, unknown_recurrent="falcon_mamba"),
    ),
    BatchCase(
        "a plain `nn.Module`", "feature vectors `(4, 10)` named `input_ids`",
        {"input_ids": (4, 10), "labels": (4,)}, model=ModelFacts(known=False),
    ),
    BatchCase(
        "float `input_ids` on a Transformers model", "`(4, 10)` floats", {"input_ids": (4, 10), "labels": (4, 10)},
        dtypes={"input_ids": "float"},
    ),
    BatchCase(
        "another per-token tensor", "`input_ids`, `labels`, `my_weights` `(4, 40)`",
        {**_lm(4, 40), "my_weights": (4, 40)},
    ),
    BatchCase(
        "dynamic NTK RoPE (`rope_type=\"dynamic\"`, `max_position_embeddings=8192`)", "4 × 8000 tokens", _lm(4, 8000),
        model=_DYNAMIC,
    ),
    BatchCase(
        "dynamic NTK RoPE, a batch as long as `max_position_embeddings`", "3 × 8192 tokens", _lm(3, 8192),
        model=_DYNAMIC,
    ),
    BatchCase(
        "LongRoPE (Phi-3.5, `original_max_position_embeddings=4096`), the 6144 rung compiled", "4 × 4000 tokens",
        _lm(4, 4000), model=_LONGROPE, used=(6144,),
    ),
    BatchCase(
        "LongRoPE (Phi-3.5), past the original context", "4 × 5000 tokens", _lm(4, 5000), model=_LONGROPE,
    ),
    BatchCase(
        "`neftune_noise_alpha=5` (NEFTune)", "4 × 70 tokens", _lm(4, 70), source=SourceFacts(neftune=True),
    ),
)


def _why_padded(case: BatchCase, plan: batch_buckets.BatchPlan) -> str:
    model, source = case.model, case.source
    reasons = []
    if source.layout is not None:
        return "; ".join([_why_layout(source.layout), *_rows_reason(case, plan)])
    if model.pools_last_token:
        reasons.append("`input_ids` padded with the config's pad token: the last non-pad token it pools is unchanged")
    elif source.packed or ("position_ids" in plan.lengths and "attention_mask" not in case.shapes):
        reasons.append("`position_ids` 0: each padding token is a packed sequence of its own, seen by no real token")
    elif plan.add_mask:
        reasons.append("an attention mask added, 0 on the padding")
    elif "attention_mask" in plan.lengths:
        reasons.append("the mask is 0 on the padding")
    elif model.causal:
        reasons.append("causal: no real token sees the padding")
    if "cu_seq_lens_q" in case.shapes:
        reasons.append("`seq_idx` and `cu_seq_lens_*` count the padding in the last sequence, after every real token")
    elif "seq_idx" in plan.lengths:
        reasons.append("`seq_idx` counts the padding in the last sequence, after every real token")
    if "labels" in plan.lengths:
        reasons.append("labels -100, which its loss ignores")
    elif "labels" in case.shapes:
        reasons.append("labels per example, not padded")
    if "completion_mask" in plan.lengths:
        reasons.append("`completion_mask` 0, which its loss ignores")
    if len(plan.sides) == 2:
        reasons.append("each side in its own bucket")
    capped = [p for p, _ in plan.sides if p in (model.max_positions, model.max_decoder_positions) and p not in _LADDER]
    if capped:
        reasons.append(f"capped at the model's {capped[0]} positions")
    for rotary in model.lengths.readers:
        longest = max(original for _, original in plan.sides)
        if rotary.rope_type == "dynamic":
            kept = "below it" if longest < rotary.threshold else "at the collated length"
            reasons.append(f"dynamic RoPE: its frequencies follow the padded length past {rotary.threshold}, kept {kept}")
        elif longest <= rotary.threshold:
            reasons.append(f"LongRoPE: short factors up to {rotary.threshold} positions, padding kept within them")
        else:
            reasons.append(f"LongRoPE: past {rotary.threshold} the long factors whatever the padding")
    reasons.extend(_rows_reason(case, plan))
    if not source.training:
        reasons.append("outputs cut back to the collator's lengths")
    return "; ".join(reasons)


def _why_layout(layout: batch_buckets.BatchLayout) -> str:
    names = [" and ".join(f"`{prefix}*`" for prefix in group) if any(group) else "the completions" for group in layout.groups]
    if len(names) > 1:
        text = f"{' and '.join(names)} each in a bucket of their own"
    else:
        text = f"{names[0]} in one bucket (the trainer concatenates them)"
    text += ": masks 0, labels -100, `completion_mask` 0 on the padding, which its loss ignores"
    if layout.unread:
        text += f"; `{layout.unread[0].split('_')[0]}_*` (generation in evaluation, not read by the loss) as collated"
    return text


def _rows_reason(case: BatchCase, plan: batch_buckets.BatchPlan) -> list[str]:
    source, model = case.source, case.model
    if plan.rows > case.shapes[next(iter(plan.lengths))][0]:
        return ["added rows have labels -100"]
    if source.keeps_rows and source.training:
        return ["no rows added: the loss reads every row (chosen and rejected halves, per-row labels, token counts)"]
    if model.aux_loss and source.training:
        return ["no rows added: its auxiliary loss counts every token the mask lets through"]
    return []


def _padded(case: BatchCase, plan: batch_buckets.BatchPlan) -> str:
    sizes = " and ".join(f"{padded}" for padded, _ in plan.sides)
    cell = f"padded to {sizes}"
    first = next(iter(plan.lengths))
    rows = case.shapes[first][0]
    if plan.rows > rows:
        cell += f", {plan.rows} rows"
    if plan.add_mask:
        cell += ", mask added"
    return cell


def batch_table(cases: Sequence[BatchCase] = BATCH_CASES) -> str:
    """The markdown table of what the Trainer's batches become on TPU (batch size 4, default ladder)."""
    lines = ["| what you train | the batch | on TPU | why |", "|---|---|---|---|"]
    for case in cases:
        plan = batch_buckets.plan_batch(
            case.shapes, ladder=_LADDER, batch_size=_BATCH, pad_rows=case.source.training, dtypes=case.dtypes,
            model=case.model, source=case.source, used=case.used,
        )
        if isinstance(plan, str):
            lines.append(f"| {case.what} | {case.batch} | left as the collator made it | {plan} |")
        else:
            lines.append(f"| {case.what} | {case.batch} | {_padded(case, plan)} | {_why_padded(case, plan)} |")
    return "\n".join(lines)


@dataclass(frozen=True)
class OptimizerCase:
    """A user's optimizer (class and one group as made) and where its parameters are."""

    what: str
    kind: str
    group: Mapping[str, Any]
    sharded: bool = False
    on_device: bool = True


_ADAMW = "torch.optim.adamw.AdamW"
OPTIMIZER_CASES: tuple[OptimizerCase, ...] = (
    OptimizerCase("`optim=\"adamw_torch_fused\"` (the Trainer's default), `AdamW(fused=True)`", _ADAMW, {"lr": 1e-3, "fused": True}),
    OptimizerCase("`optim=\"adamw_torch\"`, `torch.optim.AdamW(params)`, `Adam(params)`", _ADAMW, {"lr": 1e-3, "foreach": None}),
    OptimizerCase("`AdamW(params, foreach=False)`", _ADAMW, {"lr": 1e-3, "foreach": False}),
    OptimizerCase("`AdamW(params, lr=torch.tensor(1e-3))`", _ADAMW, {"lr": "tensor", "foreach": None}),
    OptimizerCase("`AdamW(params, differentiable=True)`", _ADAMW, {"lr": 1e-3, "differentiable": True}),
    OptimizerCase("AdamW of FSDP2 (DTensor) parameters", _ADAMW, {"lr": 1e-3, "foreach": None}, sharded=True),
    OptimizerCase("`SGD`, `Adafactor`, `RMSprop`, a subclass of `AdamW`, bitsandbytes", "torch.optim.sgd.SGD", {"lr": 1e-3}),
)


def optimizer_table(cases: Sequence[OptimizerCase] = OPTIMIZER_CASES) -> str:
    """The markdown table of how each optimizer steps on TPU."""
    lines = ["| your optimizer | during `step()` on TPU | why |", "|---|---|---|"]
    for case in cases:
        plan = training_policy.optimizer_plan(case.kind, case.group, sharded=case.sharded, on_device=case.on_device)
        if plan.action == training_policy.ADAPT:
            settings = [f"`{k}={v}`" for k, v in plan.settings.items()]
            during = ", ".join(["a device tensor learning rate", *settings])
            if plan.compile_step:
                during += "; compiled with the `tpu` backend under `torch_compile`"
        else:
            during = "as you made it"
        lines.append(f"| {case.what} | {during} | {plan.reason} |")
    return "\n".join(lines)


_TABLES = {
    "training-batches": batch_table, "training-optimizers": optimizer_table, "training-grpo": grpo_table,
    "training-losses": losses_table,
}


def render_blocks(text: str, tables: Mapping[str, Callable[[], str]]) -> str:
    """``text`` with every generated block of ``tables`` (``<!-- generated: NAME -->`` ... ``<!-- end: NAME -->``)
    re-rendered (also the inference page's, ``inference.paths``)."""
    for name, table in tables.items():
        pattern = re.compile(rf"(<!-- generated: {name} [^>]*-->\n)(.*?)(<!-- end: {name} -->)", re.S)
        text = pattern.sub(lambda m, t=table: m.group(1) + t() + "\n" + m.group(3), text)
    return text


def update_page(path: str, render_page: Callable[[str], str]) -> bool:
    """Rewrite the page at ``path`` with ``render_page``; returns whether it changed."""
    with open(path, encoding="utf-8") as handle:
        text = handle.read()
    new = render_page(text)
    if new != text:
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(new)
    return new != text


def render(text: str) -> str:
    """``text`` with the training tables re-rendered."""
    return render_blocks(text, _TABLES)


def update(path: str) -> bool:
    """Rewrite the generated tables of the page at ``path``; returns whether it changed."""
    return update_page(path, render)


if __name__ == "__main__":  # pragma: no cover - a maintainer's command
    for page in sys.argv[1:] or ["docs/training.md"]:
        print(f"{page}: {'updated' if update(page) else 'up to date'}")
