"""Which image and audio classification calls may be padded and cut back: plain data in, plain data out.

What varies from one batch to the next, and what reads the padding:

- **Image classification** (``pixel_values``, rows x channels x height x width): the image processor
  resizes every image to one size, so only the row count varies (a pipeline's partial last batch, a
  request of a few images). Rows are completed with copies of the first row and cut off again; the
  length is never padded. A row is independent of the others in evaluation (batch norm reads its
  running statistics); a model in training mode and a mixture-of-experts router are refused. Any
  other input (``pixel_mask``, ``bool_masked_pos``...) is refused.
- **Audio classification** (raw ``input_values``, rows x samples, of every length): padded on the
  right with zeros to a rung of :func:`audio_ladder` under an attention mask (zeros on the padding;
  ones on the batch's own samples where it has none). Only the families whose code was read
  (:data:`AUDIO_FAMILIES`): their convolutional feature extractor gives the frames of the real
  samples unchanged (frame ``t`` reads samples ``t*stride .. t*stride+kernel``), their encoder sets
  the masked frames to zero before its positional convolution (as the unpadded call's zero padding),
  attention masks them, and ``*ForSequenceClassification`` averages the frames under the mask. Refused:
  ``feat_extract_norm="group"`` (a GroupNorm over time in the first convolution reads every sample,
  padding included), an adapter (strided convolutions over frames after the encoder, nothing zeroed),
  hidden states or attentions asked for (per frame, not cut back), a batch shorter than one frame
  (upstream's error), a model that takes no attention mask. Whisper's audio classifier
  (:data:`FIXED_LENGTH_AUDIO`) takes log-mel ``input_features`` its feature extractor pads to 30 s: only
  its rows are padded, as images' are.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from ..ladders import geometric_ladder, round_up
from ..training.buckets import choose_length
from .policy import CallPlan, row_ladder

__all__ = [
    "AUDIO_FAMILIES",
    "FIXED_LENGTH_AUDIO",
    "MEDIA_PADDING",
    "MEDIA_PIPELINES",
    "MEDIA_TASKS",
    "MediaFacts",
    "audio_ladder",
    "frames",
    "plan_media_call",
]

#: Pipelines whose model calls :func:`plan_media_call` plans (the others of ``policy.PIPELINES`` are text).
MEDIA_PIPELINES = frozenset({"ImageClassificationPipeline", "AudioClassificationPipeline"})
MEDIA_TASKS = ("image_classification", "audio_classification")
#: Audio families whose feature extractor, encoder and pooling were read (see the module's docstring).
AUDIO_FAMILIES = frozenset({"wav2vec2", "hubert"})
#: Audio families whose feature extractor pads or cuts every clip to one length (Whisper: 30 s of log-mel
#: ``input_features``): only their rows vary, and are padded as images' are.
FIXED_LENGTH_AUDIO = frozenset({"whisper"})
#: Inputs a media call may be padded in, and their padding value.
MEDIA_PADDING: dict[str, float | int] = {"pixel_values": 0.0, "input_values": 0.0, "input_features": 0.0, "attention_mask": 0}

_AUDIO_TOP = 1 << 24


def audio_ladder() -> tuple[int, ...]:
    """Sample-count rungs: 1024, 1536, 2048, 3072, ... (2 per octave, multiples of 128; 16 kHz: 64 ms up)."""
    return geometric_ladder(1024, _AUDIO_TOP, 2, 128)


def frames(samples: int, kernel: Sequence[int], stride: Sequence[int]) -> int:
    """How many frames a convolutional feature extractor (no padding) makes of ``samples`` samples."""
    for k, s in zip(kernel, stride):
        samples = (samples - k) // s + 1
        if samples < 1:
            return 0
    return samples


@dataclass(frozen=True)
class MediaFacts:
    """What padding an image or audio classifier's call must know (read off it by ``media_calls.media_facts``).

    ``task``: one of :data:`MEDIA_TASKS` or ``None``; ``family``: the config's ``model_type``;
    ``feat_extract_norm``, ``conv_kernel``, ``conv_stride``, ``adapter``: an audio model's feature
    extractor and adapter; ``accepts``: the inputs its forward takes by name."""

    task: str | None = None
    family: str | None = None
    feat_extract_norm: str | None = None
    conv_kernel: tuple[int, ...] = ()
    conv_stride: tuple[int, ...] = ()
    adapter: bool = False
    accepts: frozenset[str] = frozenset()
    experts: bool = False
    training: bool = False


def _rows(rows: int, rows_ladder: Sequence[int], used_rows: Collection[int]) -> int:
    own = round_up(rows, rows_ladder)
    return min([r for r in used_rows if r >= own], default=own)


def plan_media_call(
    shapes: Mapping[str, Sequence[int] | None],
    model: MediaFacts,
    *,
    ladder: Sequence[int] = (),
    rows_ladder: Sequence[int] = (),
    used: Collection[int] = (),
    used_rows: Collection[int] = (),
    reuse: float = 1.5,
    dtypes: Mapping[str, str] | None = None,
    options: Mapping[str, object] | None = None,
    positional: int = 0,
) -> CallPlan | str:
    """The :class:`~.policy.CallPlan` of one image or audio classifier call, or why it runs unpadded.

    Arguments as :func:`.policy.plan_call`'s. An image call's plan pads rows only (``length`` is the
    image's width, unchanged); an audio call's pads ``input_values`` (and its mask) to a rung of
    ``ladder`` (default :func:`audio_ladder`) and its rows."""
    rows_ladder = rows_ladder or row_ladder()
    dtypes = dtypes or {}
    options = options or {}
    tensors = {k: tuple(s) for k, s in shapes.items() if s is not None}
    if positional:
        return "positional arguments: pass the inputs by name (model(**batch))"
    if model.task not in MEDIA_TASKS:
        return "not an image or audio classifier"
    if model.training:
        return "a model in training mode (dropout, batch statistics): call model.eval() first"
    if model.experts:
        return "a mixture-of-experts router: an expert capacity counts every row"
    if model.task == "image_classification" or model.family in FIXED_LENGTH_AUDIO:
        key, rank = ("pixel_values", 4) if model.task == "image_classification" else ("input_features", 3)
        if set(tensors) != {key}:
            return f"inputs other than {key}: {', '.join(sorted(set(tensors) - {key})) or 'none'}"
        shape = tensors[key]
        if dtypes.get(key) not in (None, "float") or len(shape) != rank or shape[0] < 1:
            return f"{key} that are not a batch of {rank - 1}-D float inputs"
        return CallPlan(rows=_rows(shape[0], rows_ladder, used_rows), length=shape[-1], original_rows=shape[0],
                        original_length=shape[-1], keys=(key,), pad_token_id=0)
    if model.family not in AUDIO_FAMILIES:
        return f"an audio model of the family {model.family!r}: what reads its padding is not known"
    if model.feat_extract_norm != "layer":
        return f"feat_extract_norm={model.feat_extract_norm!r}: a GroupNorm over time reads every sample, padding included"
    if model.adapter:
        return "an adapter: strided convolutions over the frames after the encoder read the padded frames"
    if "input_values" not in tensors:
        return "no input_values (input_features or other inputs): not padded"
    unknown = sorted(set(tensors) - {"input_values", "attention_mask"})
    if unknown:
        return f"inputs with no known padding: {', '.join(unknown)}"
    if dtypes.get("input_values") not in (None, "float") or dtypes.get("attention_mask") not in (None, "int", "bool"):
        return "input_values that are not float samples, or a mask that is not integer"
    shape = tensors["input_values"]
    if len(shape) != 2 or any(s != shape for s in tensors.values()):
        return "input_values and attention_mask that are not both (batch, samples)"
    rows, length = shape
    if rows < 1 or frames(length, model.conv_kernel, model.conv_stride) < 1:
        return f"{length} samples make no frame (upstream's error)"
    if options.get("output_hidden_states") or options.get("output_attentions"):
        return "hidden states or attentions per frame: not cut back"
    add_mask = "attention_mask" not in tensors
    if "attention_mask" not in model.accepts:
        return "a model that takes no attention_mask would read the padding"
    return CallPlan(
        rows=_rows(rows, rows_ladder, used_rows),
        length=choose_length(length, ladder or audio_ladder(), used, reuse),
        original_rows=rows,
        original_length=length,
        keys=tuple(k for k in MEDIA_PADDING if k in tensors),
        pad_token_id=0,
        add_mask=add_mask,
    )
