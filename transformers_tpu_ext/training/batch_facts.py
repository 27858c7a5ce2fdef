"""The plain facts :func:`transformers_tpu_ext.training.buckets.plan_batch` decides from, and its plan (pure).

:class:`ModelFacts` (what the model's kind and config say), :class:`SourceFacts` (where the batch comes
from: training, evaluation, a trainer's own loss), :class:`BatchLayout` (the keys of a library trainer's
own batches) and :class:`BatchPlan` (what is padded, and how); all are also importable from :mod:`.buckets`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from ..core.length_readers import ModelLengths

__all__ = ["BatchLayout", "BatchPlan", "ModelFacts", "SourceFacts"]


@dataclass(frozen=True)
class ModelFacts:
    """What the padding of a batch must know about the model it feeds (plain data, read off the model
    by the glue: :func:`transformers_tpu_ext.training.facts.model_facts`).

    - ``known``: a Transformers model of a task whose inputs and labels have known semantics (causal
      LM, masked LM, sequence-to-sequence LM, token or sequence classification);
    - ``causal``: every attention layer is causal (a decoder-only model): a position never sees a
      later one, so padding on the right is invisible to the real tokens without a mask;
    - ``encoder_decoder``: two sides (``input_ids`` / ``labels`` and ``decoder_*``), each with its length;
    - ``per_token_labels``: its loss takes one label per position (LM, MLM, token classification,
      seq2seq) and ignores -100;
    - ``pools_last_token``: a sequence classifier that pools the last token that is not ``pad_token_id``;
    - ``pad_token_id``: the config's; ``max_positions`` / ``max_decoder_positions``: the size of a
      position table no padding may exceed (``None``: no limit known);
    - ``accepts_attention_mask``: its forward takes ``attention_mask``;
    - ``extra_outputs``: it returns more than logits per position (hidden states, attentions,
      router logits), whose axes evaluation could not cut back;
    - ``aux_loss``: a loss term over every token the mask lets through (MoE load balancing): no rows added.

    The defaults describe a decoder-only language model (what :class:`BucketCollator` assumes
    without a model).
    """

    known: bool = True
    causal: bool = True
    encoder_decoder: bool = False
    per_token_labels: bool = True
    pools_last_token: bool = False
    pad_token_id: int | None = None
    max_positions: int | None = None
    max_decoder_positions: int | None = None
    accepts_attention_mask: bool = True
    #: The ``model_type`` of recurrent layers (state-space, convolution, linear attention) of a family
    #: ``generation.recurrent`` does not know: whether padding reaches their state is unknown. ``None``: no
    #: recurrent layers, or a known family's (its mixers run forward in time: padding on the right, masked,
    #: comes after every real token's state; tests/training/test_training_recurrent.py).
    unknown_recurrent: str | None = None
    extra_outputs: bool = False
    aux_loss: bool = False
    #: What in it reads the length of the forward pass (rotary types whose frequencies depend on it).
    lengths: ModelLengths = ModelLengths()
    #: A vision-language model of a family whose inputs were read (``generation.multimodal.FAMILIES``): the
    #: per-image inputs it takes (``pixel_values``, ``image_grid_thw``), passed through unchanged: the text is padded
    #: on the right (a placeholder never moves to another image) and no row is added (a copied row would need
    #: its images too). Empty: not such a model.
    media_keys: frozenset[str] = frozenset()


@dataclass(frozen=True)
class BatchLayout:
    """The keys of a library trainer's own batches (its collator's), where they are not Transformers' own.

    - ``groups``: key prefixes whose per-token keys are padded to one length: each group is one bucket,
      its keys the prefix and a per-token key the plan knows (``chosen_`` + ``input_ids``); ``(("",),)``
      is Transformers' own keys. TRL's ORPO and CPO concatenate their chosen and rejected answers to
      the longer of the two (one group ``("chosen_", "rejected_")``); KTO runs its KL completions in a
      forward of their own (two groups ``("",)`` and ``("KL_",)``);
    - ``per_row``: tensors of one value per row or pair (KTO's ``label``, a reward margin): never padded;
    - ``unread``: tensors the training loss never reads (ORPO's left-padded prompts, used by generation
      in evaluation only): left as collated.

    Every other tensor of the batch makes it unknown: it is left as the collator made it.
    """

    groups: tuple[tuple[str, ...], ...] = (("",),)
    per_row: tuple[str, ...] = ()
    unread: tuple[str, ...] = ()


@dataclass(frozen=True)
class SourceFacts:
    """What the padding of a batch must know about where it comes from and where it goes.

    - ``training``: a training batch (rows may be added); otherwise evaluation or prediction;
    - ``packed``: the collator packs sequences into one row told apart by ``position_ids``
      (``DataCollatorWithFlattening``);
    - ``generates``: the batch holds prompts for ``generate()`` (``predict_with_generate``);
    - ``custom_loss``: a loss of the user's (a ``compute_loss`` override, ``compute_loss_func``) not declared
      with ``ignores_padding``: whether it ignores padding is unknown; ``own_loss`` says which (the log's words);
    - ``cuts_outputs``: evaluation outputs are cut back to the collator's lengths (the Trainer's own
      ``prediction_step``);
    - ``returns_inputs``: the inputs themselves go to the metrics (``include_for_metrics=["inputs"]``);
    - ``keeps_rows``: the loss or its logged metrics read every row of the batch (TRL's trainers: DPO
      pairs the first and second halves of the rows, SFT counts the attention mask's tokens): no rows added;
    - ``layout``: the keys of a library trainer's own batches (:class:`BatchLayout`; ``None``: Transformers'
      keys, as its collators make them).

    The defaults describe a user's own training loop.
    """

    training: bool = True
    packed: bool = False
    generates: bool = False
    custom_loss: bool = False
    own_loss: str = ""
    cuts_outputs: bool = False
    returns_inputs: bool = False
    keeps_rows: bool = False
    neftune: bool = False  # NEFTune noise on the input embeddings (neftune_noise_alpha)
    layout: BatchLayout | None = None


@dataclass(frozen=True)
class BatchPlan:
    """How to pad one batch: rows to ``rows``, and each key in ``lengths`` (on the right) to its length.

    ``add_mask``: add an ``attention_mask`` to the plan (ones on the real tokens, zeros on the
    padding). ``pad_token_id``: the id ``input_ids`` are padded with when it must be the model's
    (``None``: the collator's). ``sides``: ``(padded, original)`` length of each side that is padded
    (the encoder or only side first), what evaluation outputs are cut back with. ``sequence`` is the
    longest padded length (the buckets used are the first items of ``sides``). ``fills``: the padding
    value of a key whose name is not the per-token key it stands for (a :class:`BatchLayout`'s prefixed
    keys); the others take :data:`~transformers_tpu_ext.training.buckets.SEQUENCE_PADDING`'s.
    """

    rows: int
    lengths: Mapping[str, int]
    sequence: int
    add_mask: bool = False
    pad_token_id: int | None = None
    sides: tuple[tuple[int, int], ...] = ()
    fills: Mapping[str, int | str] = field(default_factory=dict)

    @property
    def buckets(self) -> tuple[int, ...]:
        """The padded length of each side (what :func:`choose_length` reuses)."""
        return tuple(padded for padded, _ in self.sides) or (self.sequence,)
