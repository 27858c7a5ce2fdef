"""Image and audio classification pipelines on the simulated TPU (patch ``pipeline_buckets``, ``inference.media``).

Images: the processor resizes every image to one size, so only the row count varies (requests of a
few images, a partial last batch); rows are padded. Audio: raw samples of every length, padded
under a mask for the families whose code reads no padding. Each test runs 200 inputs of random
sizes: the second 100 compile nothing (cache-only), and every result equals plain Transformers on
the CPU (same labels and order, scores within 1e-5). A refused configuration (GroupNorm over time)
runs as upstream's, with the CPU's results.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from transformers import pipeline  # noqa: E402

import transformers_tpu_ext as ext  # noqa: E402
from transformers_tpu_ext.inference import media, policy, runtime  # noqa: E402
from transformers_tpu_ext.inference.media_calls import MediaCalls  # noqa: E402
from transformers_tpu_ext.testing.programs import NewProgramsError  # noqa: E402

from _inference import assert_same, steady  # noqa: E402

pytestmark = pytest.mark.slow  # ~70 s in all: 200 images, 4 x 200 clips, each on the CPU and on the TPU

BATCH = 8
SIZE = 32


@pytest.fixture
def tpu(simulated_tpu):
    import transformers.pipelines.base  # noqa: F401 - the patch's target

    ext.activate()
    assert "pipeline_buckets" in ext.active_patches()
    return simulated_tpu


def tiny_vit():
    from transformers import ViTConfig, ViTForImageClassification

    torch.manual_seed(0)
    config = ViTConfig(image_size=SIZE, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                       intermediate_size=64, num_labels=4, initializer_range=0.3)
    return ViTForImageClassification(config).eval()


def vit_processor():
    pytest.importorskip("PIL")  # the `vision` extra (the PIL image processor: no torchvision needed)
    from transformers import ViTImageProcessorPil

    return ViTImageProcessorPil(size={"height": SIZE, "width": SIZE})


def images(count: int, seed: int) -> list:
    Image = pytest.importorskip("PIL.Image")
    rng = np.random.default_rng(seed)
    return [Image.fromarray(rng.integers(0, 256, (int(rng.integers(12, 64)), int(rng.integers(12, 64)), 3), dtype=np.uint8))
            for _ in range(count)]


def requests(items: list, seed: int) -> list[list]:
    """``items`` cut into requests of 1 to 12 inputs: partial batches of every row count."""
    rng, out, start = random.Random(seed), [], 0
    while start < len(items):
        size = rng.randint(1, 12)
        out.append(items[start:start + size])
        start += size
    return out


def _serve(pipe, chunks, **call) -> list:
    return [row for chunk in chunks for row in pipe(chunk, batch_size=BATCH, **call)]


def test_image_classification_reaches_a_steady_state_with_the_cpus_results(tpu):
    first, second = requests(images(100, 1), 1), requests(images(100, 2), 2)
    expected = _serve(pipeline("image-classification", model=tiny_vit(), image_processor=vit_processor(), device="cpu"),
                      first + second, top_k=4)
    pipe = pipeline("image-classification", model=tiny_vit(), image_processor=vit_processor(), device="tpu")
    got = _serve(pipe, first, top_k=4)
    with steady("the second 100 images"):
        got += _serve(pipe, second, top_k=4)
    calls = runtime.for_model(pipe.model, drop_cache=True, kind=MediaCalls)
    assert calls.padded > 0 and calls.used_rows <= {1, 2, 4, 8}
    assert_same(got, expected)
    assert len({row[0]["label"] for row in got}) > 1, "a constant classifier proves nothing"


def test_without_the_row_buckets_the_second_100_images_compile(tpu, monkeypatch):
    # The same requests through upstream's path: partial batches of row counts the first pass never ran.
    monkeypatch.setattr(policy, "PIPELINES", policy.PIPELINES - {"ImageClassificationPipeline"})
    pipe = pipeline("image-classification", model=tiny_vit(), image_processor=vit_processor(), device="tpu")
    _serve(pipe, requests(images(100, 1), 1))
    with pytest.raises((NewProgramsError, RuntimeError), match="compil"), steady("the second 100 images, upstream's path"):
        _serve(pipe, requests(images(100, 2), 2))


def tiny_wav2vec2(norm: str = "layer", family: str = "wav2vec2"):
    from transformers import HubertConfig, HubertForSequenceClassification, Wav2Vec2Config, Wav2Vec2ForSequenceClassification

    config_class, model_class = {"wav2vec2": (Wav2Vec2Config, Wav2Vec2ForSequenceClassification),
                                 "hubert": (HubertConfig, HubertForSequenceClassification)}[family]
    torch.manual_seed(0)
    config = config_class(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                          conv_dim=(16, 16), conv_kernel=(10, 3), conv_stride=(5, 2), num_conv_pos_embeddings=16,
                          num_conv_pos_embedding_groups=2, feat_extract_norm=norm, classifier_proj_size=16,
                          num_labels=3, initializer_range=0.3, conv_bias=True)
    return model_class(config).eval()


def audio_processor(mask: bool):
    from transformers import Wav2Vec2FeatureExtractor

    return Wav2Vec2FeatureExtractor(return_attention_mask=mask)


def clips(count: int, seed: int, lengths: list[int] | None = None) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    lengths = lengths or [int(n) for n in rng.integers(200, 3000, count)]
    return [rng.standard_normal(n).astype(np.float32) for n in lengths]


def covering(batch: int = 4) -> list[np.ndarray]:
    """A batch per rung of the audio ladder up to 3072 samples: the first pass runs every rung."""
    return clips(0, 9, [rung - 7 for rung in media.audio_ladder() if rung <= 3072 for _ in range(batch)])


def _audio(tpu_norm: str, mask: bool, family: str = "wav2vec2") -> tuple[list, list, MediaCalls]:
    first, second = covering() + clips(84, 3), clips(100, 4)
    cpu = pipeline("audio-classification", model=tiny_wav2vec2(tpu_norm, family), feature_extractor=audio_processor(mask),
                   device="cpu")
    expected = cpu(first + second, batch_size=4, top_k=3)
    pipe = pipeline("audio-classification", model=tiny_wav2vec2(tpu_norm, family), feature_extractor=audio_processor(mask),
                    device="tpu")
    got = pipe(first, batch_size=4, top_k=3)
    calls = runtime.for_model(pipe.model, drop_cache=True, kind=MediaCalls)
    if calls.padded:
        with steady(f"the second 100 clips ({family}, mask={mask})"):
            got += pipe(second, batch_size=4, top_k=3)
    else:
        got += pipe(second, batch_size=4, top_k=3)
    assert_same(got, expected)
    assert len({row[0]["score"] for row in got}) > 100, "a constant classifier proves nothing"
    return got, expected, calls


@pytest.mark.parametrize(("family", "mask"), [("wav2vec2", True), ("wav2vec2", False), ("hubert", True)])
def test_audio_classification_reaches_a_steady_state_with_the_cpus_results(tpu, family, mask):
    got, _, calls = _audio("layer", mask, family)
    assert calls.padded > 0 and not calls.reasons, calls.reasons
    assert len({row[0]["label"] for row in got}) > 1, "a constant classifier proves nothing"
    assert calls.used <= set(media.audio_ladder()[:4])


def test_group_norm_over_time_is_refused_and_gives_the_cpus_results(tpu):
    _, _, calls = _audio("group", True)
    assert calls.padded == 0
    assert any("GroupNorm over time" in reason for reason in calls.reasons)
