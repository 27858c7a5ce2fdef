"""Which vision-language ``generate()`` calls are padded to buckets, and how (pure: plain data, no torch).

A vision-language prompt carries more than its token ids: tensors with one value per prompt column
(``token_type_ids``, ``mm_token_type_ids``), tensors with one row per image (``pixel_values``,
``image_grid_thw``), and, for Qwen-VL, 3-D rotary positions computed from all of them. Padding the
prompt on the left (and adding dummy rows) is exact only where everything that reads those shapes is
known; :func:`media_plan` is the "safe when" predicate, over :class:`MediaCall` (what the glue read
off the model and the call). What each family does with them, read in Transformers 5.25's code:

- **The images** are encoded before the prefill (``_prepare_multimodal_encoder_kwargs_for_generation``:
  the family's ``get_image_features``, eagerly, on the pixel inputs alone; the text never reaches the
  vision tower) and their features are scattered, in order, onto the placeholder tokens of the prompt
  (``input_ids == image_token_id``). Left padding adds no placeholder, so the features land on the same
  tokens. The pixel inputs go to the model's device for that encoder; ``image_grid_thw`` stays beside
  the token ids for the positions below.
- **Per-column inputs** are padded on the left with 0 (text): Gemma 3's ``token_type_ids`` (its
  bidirectional image blocks are runs of 1s: a 0 column joins none, and the padding mask hides it) and
  Qwen-VL's ``mm_token_type_ids`` (read by ``get_rope_index`` over the attention mask's tokens only).
- **Positions**: text families take them from the attention mask (padding ignored); Qwen-VL's
  ``_prepare_position_ids_for_generation`` runs ``get_rope_index`` over the tokens the mask keeps, and
  its ``rope_deltas`` are ``max(position) + 1 - (tokens kept)``: left padding changes neither. Each
  decode step adds one to every axis (upstream's ``_update_model_kwargs_for_generation``), on the device.
- **Dummy rows** (a batch rounded up) are copies of the first row whose placeholders are replaced by the
  pad token and masked, with type 0: they hold no image, so the features still match the placeholders.
- **The prefill runs in one piece** (one compiled forward per batch bucket, prompt bucket and number of
  image features): upstream's chunked prefill would hand each chunk the features of the placeholders it
  holds, a count that moves with the padding, and Gemma 3's chunks read ``token_type_ids`` from the start
  of the sequence (a new shape per chunk).

Anything else (another family, video inputs, ``image_sizes``, a model that does not pre-encode its images,
placeholder ids the config does not name) is not padded: the call keeps the static cache, with one WARNING.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["FAMILIES", "PER_ROW_PADDING", "Family", "MediaCall", "MediaPlan", "media_plan", "warmup_image_sets"]

#: Per-column inputs the plugin pads, and the value of their padding columns (0: text).
PER_ROW_PADDING: Mapping[str, int] = {"token_type_ids": 0, "mm_token_type_ids": 0}


@dataclass(frozen=True)
class Family:
    """A vision-language family whose generation code was read: the inputs it takes per column and per image,
    and the per-image inputs the positions read beside the token ids (kept on the host with them)."""

    per_column: frozenset[str] = frozenset()
    per_image: frozenset[str] = frozenset({"pixel_values"})
    positions_read: frozenset[str] = frozenset()  # per-image inputs get_rope_index reads (with the ids, on the host)
    note: str = ""


_QWEN = Family(frozenset({"mm_token_type_ids"}), frozenset({"pixel_values", "image_grid_thw"}),
               frozenset({"image_grid_thw"}), "3-D M-RoPE positions from get_rope_index over the kept tokens")

#: The families :func:`media_plan` recognises (``config.model_type``).
FAMILIES: Mapping[str, Family] = {
    "llava": Family(note="CLIP tower, features scattered onto image tokens, text positions"),
    "gemma3": Family(frozenset({"token_type_ids"}), note="SigLIP tower, bidirectional attention over each image's tokens"),
    "qwen2_vl": _QWEN,
    "qwen2_5_vl": _QWEN,
    "qwen3_vl": _QWEN,
}


@dataclass(frozen=True)
class MediaCall:
    """What the glue read off a vision-language ``generate()`` call and its model (plain data).

    ``family``: ``config.model_type``; ``per_column``: the call's tensors shaped like its prompt (rows x
    columns) besides the ids and the mask; ``per_item``: its other tensors; ``placeholder_ids``: whether the
    config names its placeholder token ids (``image_token_id``...); ``pre_encodes``: whether upstream encodes
    the images before the prefill (the model takes ``mm_encoder_outputs``)."""

    family: str | None
    per_column: frozenset[str] = frozenset()
    per_item: frozenset[str] = frozenset()
    placeholder_ids: bool = True
    pre_encodes: bool = True


@dataclass(frozen=True)
class MediaPlan:
    """``pad``: the call may be padded (left padding, dummy rows) with its media inputs; ``reason`` why (not);
    ``one_piece``: prefill the padded prompt in one piece; ``host``: per-image inputs kept on the host (the
    positions read them beside the ids; upstream's encoder gets them on the model's device)."""

    pad: bool
    reason: str
    one_piece: bool = True
    host: frozenset[str] = frozenset()


def media_plan(call: MediaCall) -> MediaPlan:
    """Whether a vision-language call may be padded to buckets (see the module's docstring)."""
    family = FAMILIES.get(call.family or "")
    if family is None:
        return MediaPlan(False, f"a vision-language family whose inputs were not read ({call.family})")
    unknown = sorted((call.per_column - family.per_column) | (call.per_item - family.per_image))
    if unknown:
        return MediaPlan(False, f"inputs of {call.family} the plugin does not pad: {', '.join(unknown)}")
    if not call.placeholder_ids:
        return MediaPlan(False, "the config names no placeholder token id (image_token_id)")
    if call.per_item and not call.pre_encodes:
        return MediaPlan(False, "the model does not encode its images before the prefill (no mm_encoder_outputs)")
    what = "images" if call.per_item else "text only"
    return MediaPlan(True, f"{call.family} ({what}): {family.note}", True, family.positions_read & call.per_item)


def warmup_image_sets(rows: int, kinds: int) -> list[tuple[int, ...]]:
    """The image sequences a warm-up runs for a batch of ``rows`` rows and ``kinds`` image sizes: every
    sequence of 0 to ``rows`` images (one a row, the first rows), each of one of the sizes (by index), in
    every order (the vision tower's programs are keyed by the sizes in order: ``torch.split`` sizes)."""
    sets: list[tuple[int, ...]] = [()]
    frontier: list[tuple[int, ...]] = [()]
    for _ in range(rows):
        frontier = [seq + (kind,) for seq in frontier for kind in range(kinds)]
        sets.extend(frontier)
    return sets
