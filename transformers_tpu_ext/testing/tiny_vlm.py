"""Tiny vision-language models and their real processors, built from configs (no downloads).

One per family Transformers ships in these shapes (:data:`FAMILIES`)::

    llava        CLIP vision tower, fixed 8 x 8 images, 16 image tokens an image (LlavaProcessor)
    gemma3       SigLIP tower, fixed 8 x 8 images pooled to 4 tokens, bidirectional image attention
                 (token_type_ids), sliding and global layers (Gemma3Processor)
    qwen2_vl     dynamic resolution: an image of h x w pixels gives (h/8) x (w/8) tokens, 3-D M-RoPE
                 positions (mm_token_type_ids, image_grid_thw) (Qwen2VLProcessor)
    qwen2_5_vl   as qwen2_vl, windowed vision attention (Qwen2_5_VLProcessor)
    qwen3_vl     as qwen2_vl, DeepStack features, interleaved M-RoPE (Qwen3VLProcessor)

The text decoders are context-sensitive (``initializer_range`` 0.3; Gemma's 0.02, as ``tiny.tiny_config``);
the processors are the families' own (PIL image processors: pillow, no torchvision) around
``tiny.tiny_tokenizer()`` with the family's special tokens. :func:`vlm_requests` gives mixed
requests: images of two sizes, text-only prompts, batches of 1 and 2, as a service sees them.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

__all__ = ["FAMILIES", "IMAGE_SIZES", "VLMRequest", "tiny_vlm", "vlm_images", "vlm_requests"]

#: The two image sizes (height, width) the requests use (the fixed-resolution processors resize both).
IMAGE_SIZES = ((16, 16), (16, 24))

_TEXT = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             head_dim=8, max_position_embeddings=512, initializer_range=0.3, pad_token_id=0, eos_token_id=1, bos_token_id=1)

#: Each family's special tokens (added to the tiny tokenizer as extra special tokens, in this order).
_TOKENS: dict[str, dict[str, str]] = {
    "llava": {"image_token": "<image>"},
    "gemma3": {"boi_token": "<start_of_image>", "image_token": "<image_soft_token>", "eoi_token": "<end_of_image>"},
    "qwen2_vl": {"image_token": "<|image_pad|>", "video_token": "<|video_pad|>",
                 "vision_start_token": "<|vision_start|>", "vision_end_token": "<|vision_end|>"},
}
_TOKENS["qwen2_5_vl"] = _TOKENS["qwen3_vl"] = _TOKENS["qwen2_vl"]

#: What a prompt writes for one image (the processor expands it to the image's tokens).
_PLACEHOLDER = {"llava": "<image>", "gemma3": "<start_of_image>", "qwen2_vl": "<|vision_start|><|image_pad|><|vision_end|>"}
_PLACEHOLDER["qwen2_5_vl"] = _PLACEHOLDER["qwen3_vl"] = _PLACEHOLDER["qwen2_vl"]

FAMILIES: tuple[str, ...] = ("llava", "gemma3", "qwen2_vl", "qwen2_5_vl", "qwen3_vl")


def _tokenizer(family: str) -> Any:
    from transformers import PreTrainedTokenizerFast

    from .tiny import tiny_tokenizer

    base = tiny_tokenizer()
    return PreTrainedTokenizerFast(tokenizer_object=base.backend_tokenizer, pad_token="<|pad|>", eos_token="<|eos|>",
                                   padding_side="left", extra_special_tokens=dict(_TOKENS[family]))


def _qwen_vision(family: str, hidden: int) -> dict[str, Any]:
    vision = dict(depth=2, hidden_size=hidden, num_heads=2, in_channels=3, patch_size=4, spatial_merge_size=2,
                  temporal_patch_size=2, initializer_range=0.3)
    if family == "qwen2_vl":
        vision.update(embed_dim=32, mlp_ratio=2)
    elif family == "qwen2_5_vl":
        vision.update(intermediate_size=64, window_size=16, fullatt_block_indexes=[1], out_hidden_size=hidden)
    else:  # qwen3_vl
        vision.update(intermediate_size=64, out_hidden_size=hidden, num_position_embeddings=16,
                      deepstack_visual_indexes=[0])
    return vision


def tiny_vlm(family: str = "llava", seed: int = 0) -> tuple[Any, Any]:
    """``(model, processor)`` of ``family`` (one of :data:`FAMILIES`): float32, on CPU, in eval mode."""
    import torch
    from transformers import AutoConfig, AutoModelForImageTextToText

    if family not in FAMILIES:
        raise ValueError(f"unknown tiny vision-language family {family!r}; choose one of {list(FAMILIES)}")
    tokenizer = _tokenizer(family)
    vocab = len(tokenizer)
    ids = {name: tokenizer.convert_tokens_to_ids(token) for name, token in _TOKENS[family].items()}
    text = dict(_TEXT, vocab_size=vocab)
    if family == "llava":
        from transformers import LlavaImageProcessorPil, LlavaProcessor

        config = AutoConfig.for_model(
            "llava", text_config=dict(text, model_type="llama"), image_token_id=ids["image_token"],
            vision_config=dict(model_type="clip_vision_model", image_size=8, patch_size=2, hidden_size=32,
                               intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, projection_dim=32,
                               initializer_range=0.3),
            vision_feature_select_strategy="default", vision_feature_layer=-1, image_seq_length=16)
        images = LlavaImageProcessorPil(size={"shortest_edge": 8}, crop_size={"height": 8, "width": 8})
        processor = LlavaProcessor(image_processor=images, tokenizer=tokenizer, patch_size=2,
                                   vision_feature_select_strategy="default", num_additional_image_tokens=1)
    elif family == "gemma3":
        from transformers import Gemma3ImageProcessorPil, Gemma3Processor

        config = AutoConfig.for_model(
            "gemma3", text_config=dict(text, model_type="gemma3_text", initializer_range=0.02, query_pre_attn_scalar=8,
                                       sliding_window=8, layer_types=["sliding_attention", "full_attention"]),
            vision_config=dict(model_type="siglip_vision_model", image_size=8, patch_size=2, hidden_size=32,
                               intermediate_size=64, num_hidden_layers=2, num_attention_heads=2),
            mm_tokens_per_image=4, image_token_id=ids["image_token"], boi_token_id=ids["boi_token"],
            eoi_token_id=ids["eoi_token"], initializer_range=0.02)
        images = Gemma3ImageProcessorPil(size={"height": 8, "width": 8})
        processor = Gemma3Processor(image_processor=images, tokenizer=tokenizer, image_seq_length=4)
    else:
        from transformers import AutoProcessor  # noqa: F401 - the family's classes below
        import transformers

        vision = _qwen_vision(family, text["hidden_size"])
        extra = {}
        if family == "qwen2_vl":
            extra = dict(rope_parameters={"rope_type": "default", "mrope_section": [1, 1, 2], "rope_theta": 10000.0})
        elif family == "qwen2_5_vl":
            extra = dict(rope_parameters={"rope_type": "default", "mrope_section": [1, 1, 2], "rope_theta": 10000.0})
        else:
            extra = dict(rope_parameters={"rope_type": "default", "mrope_section": [1, 1, 2], "mrope_interleaved": True,
                                          "rope_theta": 10000.0})
        config = AutoConfig.for_model(
            family, text_config=dict(text, model_type=f"{family}_text", **extra), vision_config=vision,
            image_token_id=ids["image_token"], video_token_id=ids["video_token"],
            vision_start_token_id=ids["vision_start_token"], vision_end_token_id=ids["vision_end_token"])
        prefix = {"qwen2_vl": "Qwen2VL", "qwen2_5_vl": "Qwen2_5_VL", "qwen3_vl": "Qwen3VL"}[family]
        image_class = getattr(transformers, "Qwen2VLImageProcessorPil")
        images = image_class(patch_size=4, merge_size=2, temporal_patch_size=2, min_pixels=64, max_pixels=32 * 32,
                             size={"shortest_edge": 64, "longest_edge": 32 * 32})
        processor_class = getattr(transformers, f"{prefix}Processor")
        processor = _images_only(processor_class)(image_processor=images, tokenizer=tokenizer)
    config.pad_token_id = 0
    torch.manual_seed(seed)
    model = AutoModelForImageTextToText.from_config(config, dtype=torch.float32)
    model.generation_config.pad_token_id = 0
    model.generation_config.eos_token_id = 1
    return model.eval(), processor


def _images_only(processor_class: type) -> type:
    """``processor_class`` without its video processor (Transformers' video processors need torchvision)."""

    def check_argument_for_proper_class(self: Any, name: str, argument: Any) -> Any:
        if argument is None and "video" in name:
            return None
        return processor_class.check_argument_for_proper_class(self, name, argument)

    return type(processor_class.__name__, (processor_class,), {"check_argument_for_proper_class": check_argument_for_proper_class})


def vlm_images(count: int, seed: int = 0, sizes: tuple[tuple[int, int], ...] = IMAGE_SIZES) -> list[Any]:
    """``count`` RGB PIL images of random noise, each of one of ``sizes`` (height, width), in turn."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    return [Image.fromarray(rng.integers(0, 256, (*sizes[i % len(sizes)], 3), dtype=np.uint8)) for i in range(count)]


_WORDS = "the quick brown fox jumps over a lazy dog while tiny models test a plugin on a simulated chip".split()


@dataclass(frozen=True)
class VLMRequest:
    """One ``generate()`` call: its prompts, images (one per prompt, or none), and ``max_new_tokens``."""

    texts: tuple[str, ...]
    images: tuple[Any, ...] | None
    new_tokens: int


def vlm_requests(family: str, count: int = 12, seed: int = 0, *, batches: tuple[int, ...] = (1, 2),
                 new_tokens: tuple[int, int] = (4, 8), words: tuple[int, int] = (1, 14)) -> list[VLMRequest]:
    """``count`` mixed calls: batches of 1 or 2 prompts of ``words`` random words (3 to about 40 tokens);
    two of every three calls with one image a prompt (the sizes of :data:`IMAGE_SIZES` in turn), one text-only."""
    rng = random.Random(seed)
    requests, image_seed = [], seed
    for index in range(count):
        batch = rng.choice(batches)
        with_images = index % 3 != 2
        texts = []
        for _ in range(batch):
            prompt = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(*words)))
            texts.append(f"{_PLACEHOLDER[family]} {prompt}" if with_images else prompt)
        images = None
        if with_images:
            images = tuple(vlm_images(batch, seed=image_seed, sizes=(IMAGE_SIZES[index % 2],)))
            image_seed += 1
        requests.append(VLMRequest(tuple(texts), images, rng.randint(*new_tokens)))
    return requests


def processed(processor: Any, request: VLMRequest) -> dict[str, Any]:
    """The processor's tensors for ``request`` (left padding), as a user passes them to ``generate()``."""
    kwargs: dict[str, Any] = {"text": list(request.texts), "return_tensors": "pt", "padding": True}
    if request.images is not None:
        kwargs["images"] = [[image] for image in request.images]
    return dict(processor(**kwargs))
