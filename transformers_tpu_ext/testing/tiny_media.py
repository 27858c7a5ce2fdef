"""Tiny image and audio classifiers built from configs (no downloads), and random inputs of random sizes.

Context-sensitive (``initializer_range=0.3``): different inputs give different labels. Used by
tests/inference/test_media_pipelines.py, benchmarks/bench_infer.py and docs/inference.md.
"""

from __future__ import annotations

import random
from typing import Any

__all__ = ["IMAGE_SIZE", "clips", "image_processor", "images", "requests", "tiny_audio_classifier", "tiny_vit", "tiny_whisper",
           "tiny_whisper_generation"]

#: The side images are resized to (the ViT's ``image_size``).
IMAGE_SIZE = 32


def tiny_vit(seed: int = 0, num_labels: int = 4) -> Any:
    """A 2-layer, 32-wide ViT image classifier of 32 x 32 images (patches of 8), in evaluation mode."""
    import torch
    from transformers import ViTConfig, ViTForImageClassification

    torch.manual_seed(seed)
    config = ViTConfig(image_size=IMAGE_SIZE, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                       intermediate_size=64, num_labels=num_labels, initializer_range=0.3)
    return ViTForImageClassification(config).eval()


def image_processor() -> Any:
    """A ViT image processor resizing to :data:`IMAGE_SIZE` (the PIL one: needs pillow, not torchvision)."""
    from transformers import ViTImageProcessorPil

    return ViTImageProcessorPil(size={"height": IMAGE_SIZE, "width": IMAGE_SIZE})


def images(count: int, seed: int = 0) -> list[Any]:
    """``count`` RGB PIL images of random noise, 12 to 63 pixels on a side."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    return [Image.fromarray(rng.integers(0, 256, (int(rng.integers(12, 64)), int(rng.integers(12, 64)), 3), dtype=np.uint8))
            for _ in range(count)]


def requests(items: list[Any], seed: int = 0, largest: int = 12) -> list[list[Any]]:
    """``items`` cut into requests of 1 to ``largest`` inputs (a server's calls: partial batches of every size)."""
    rng, out, start = random.Random(seed), [], 0
    while start < len(items):
        size = rng.randint(1, largest)
        out.append(items[start:start + size])
        start += size
    return out


def tiny_audio_classifier(family: str = "wav2vec2", norm: str = "layer", seed: int = 0, num_labels: int = 3) -> Any:
    """A 2-layer, 32-wide ``Wav2Vec2ForSequenceClassification`` (or HuBERT's): two convolutions (kernels 10 and 3,
    strides 5 and 2: a frame per 10 samples), ``feat_extract_norm=norm``, in evaluation mode."""
    import torch
    from transformers import HubertConfig, HubertForSequenceClassification, Wav2Vec2Config, Wav2Vec2ForSequenceClassification

    config_class, model_class = {"wav2vec2": (Wav2Vec2Config, Wav2Vec2ForSequenceClassification),
                                 "hubert": (HubertConfig, HubertForSequenceClassification)}[family]
    torch.manual_seed(seed)
    config = config_class(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                          conv_dim=(16, 16), conv_kernel=(10, 3), conv_stride=(5, 2), num_conv_pos_embeddings=16,
                          num_conv_pos_embedding_groups=2, feat_extract_norm=norm, classifier_proj_size=16,
                          num_labels=num_labels, initializer_range=0.3)
    return model_class(config).eval()


def tiny_whisper(seed: int = 0, num_labels: int = 3) -> tuple[Any, Any]:
    """A 2-layer, 32-wide ``WhisperForAudioClassification`` of 1-second clips (16 mel bins, 20 frames of 800 samples) and
    its ``WhisperFeatureExtractor`` (every clip padded or cut to 16,000 samples), the model in evaluation mode."""
    import torch
    from transformers import WhisperConfig, WhisperFeatureExtractor, WhisperForAudioClassification

    torch.manual_seed(seed)
    config = WhisperConfig(d_model=32, encoder_layers=2, encoder_attention_heads=2, encoder_ffn_dim=64, decoder_layers=1,
                           decoder_attention_heads=2, decoder_ffn_dim=64, num_mel_bins=16, max_source_positions=10,
                           num_labels=num_labels, initializer_range=0.3, classifier_proj_size=16)
    return WhisperForAudioClassification(config).eval(), WhisperFeatureExtractor(
        chunk_length=1, feature_size=16, hop_length=800, n_fft=400)


def tiny_whisper_generation(seed: int = 0) -> tuple[Any, Any]:
    """A 2-layer, 32-wide ``WhisperForConditionalGeneration`` (64-token vocabulary: 0 padding, 1 beginning, 2 end of
    transcript, 3 start of transcript; no suppressed tokens) of 1-second clips, and :func:`tiny_whisper`'s feature
    extractor (every clip padded or cut to 16,000 samples: 20 frames), the model in evaluation mode. Context-sensitive
    (``initializer_range=0.3``): different clips give different transcripts."""
    import torch
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    torch.manual_seed(seed)
    config = WhisperConfig(vocab_size=64, d_model=32, encoder_layers=2, encoder_attention_heads=2, encoder_ffn_dim=64,
                           decoder_layers=2, decoder_attention_heads=2, decoder_ffn_dim=64, num_mel_bins=16,
                           max_source_positions=10, max_target_positions=64, initializer_range=0.3, pad_token_id=0,
                           bos_token_id=1, eos_token_id=2, decoder_start_token_id=3, suppress_tokens=[],
                           begin_suppress_tokens=[])
    return WhisperForConditionalGeneration(config).eval(), tiny_whisper()[1]


def clips(count: int, seed: int = 0, lengths: list[int] | None = None, shortest: int = 200, longest: int = 3000) -> list[Any]:
    """``count`` mono float32 clips of Gaussian noise of random lengths (or of ``lengths``)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    lengths = lengths if lengths is not None else [int(n) for n in rng.integers(shortest, longest, count)]
    return [rng.standard_normal(n).astype(np.float32) for n in lengths]
