"""Issue 38: vision-language and speech ``generate()`` on the simulated TPU, equal to the CPU, at steady state.

Each family is a context-sensitive tiny model with its real processor (``testing.tiny_vlm``, Whisper from
``testing.tiny_media``). Mixed calls (images of two sizes and text-only prompts, batches of 1 to 3, 4 to 8 new
tokens) give the CPU's tokens; after ``warmup()`` the same calls run in torch_tpu's cache-only mode (any program
the process does not hold fails the call). ``benchmarks/bench_generate.py --family`` measures the programs.
"""

from __future__ import annotations

import logging

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("PIL")

import transformers_tpu_ext  # noqa: E402
from transformers_tpu_ext.testing import tiny_media, tiny_vlm  # noqa: E402

pytestmark = pytest.mark.slow


def _work(family: str, count: int, batches=(1, 2)):
    model, processor = tiny_vlm.tiny_vlm(family)
    requests = tiny_vlm.vlm_requests(family, count, batches=batches)
    inputs = [tiny_vlm.processed(processor, r) for r in requests]
    expected = [model.generate(**i, max_new_tokens=r.new_tokens, do_sample=False) for i, r in zip(inputs, requests)]
    return model, processor, requests, inputs, expected


def _on_tpu(inputs: dict) -> dict:
    return {name: value.to("tpu") for name, value in inputs.items()}


def test_the_tiny_families_are_context_sensitive():
    """Two prompts with the same image and the same last words, different first words, continue differently."""
    for family in tiny_vlm.FAMILIES:
        model, processor = tiny_vlm.tiny_vlm(family)
        image = tiny_vlm.vlm_images(1)
        placeholder = tiny_vlm._PLACEHOLDER[family]
        outs = []
        for words in ("a lazy dog jumps over", "tiny chips test the plugin over"):
            inputs = dict(processor(text=[f"{placeholder} {words} the quick brown fox"], images=[image], return_tensors="pt"))
            outs.append(model.generate(**inputs, max_new_tokens=6, min_new_tokens=6, do_sample=False)[0, -6:].tolist())
        assert outs[0] != outs[1], family


@pytest.mark.parametrize("family", tiny_vlm.FAMILIES)
def test_mixed_calls_give_the_cpus_tokens(simulated_tpu, family, caplog):
    # Batches of 1 to 3: a batch of 3 runs in the bucket of 4 with a dummy row that must hold no image.
    model, _, requests, inputs, expected = _work(family, 6, batches=(1, 2, 3))
    assert any(len(r.texts) == 3 and r.images for r in requests)
    model.to("tpu")
    with caplog.at_level(logging.DEBUG, logger="transformers_tpu_ext"):
        for index, (call, request, cpu) in enumerate(zip(inputs, requests, expected)):
            out = model.generate(**_on_tpu(call), max_new_tokens=request.new_tokens, do_sample=False)
            assert out.device.type == "tpu"
            assert torch.equal(out.cpu(), cpu), f"{family} call {index}: {out.cpu().tolist()} != {cpu.tolist()}"
    said = [r.getMessage() for r in caplog.records]
    assert not any("left to upstream" in m or "not bucketed" in m for m in said), said
    if family != "gemma3":  # Gemma 3 builds its own (bidirectional) masks: the host loop, said at WARNING
        assert any("decoding loop on the device" in m for m in said)


@pytest.mark.parametrize("family", ["llava", "qwen2_vl"])
def test_after_warmup_mixed_calls_compile_nothing(simulated_tpu, cache_only, family):
    model, processor, requests, inputs, expected = _work(family, 6)
    model.to("tpu")
    longest = max(i["input_ids"].shape[1] for i in inputs)
    transformers_tpu_ext.warmup(model, max_prompt_length=longest, max_new_tokens=8, batch_sizes=[1, 2],
                                processor=processor, images=tiny_vlm.vlm_images(2))
    for index, (call, request, cpu) in enumerate(zip(inputs, requests, expected)):
        with cache_only(f"{family} call {index}"):
            out = model.generate(**_on_tpu(call), max_new_tokens=request.new_tokens, do_sample=False)
        assert torch.equal(out.cpu(), cpu), f"{family} call {index}"


def test_whisper_second_half_compiles_nothing_and_warmup_covers_all(simulated_tpu, cache_only):
    import random

    model, extractor = tiny_media.tiny_whisper_generation()
    rng = random.Random(0)
    audio = tiny_media.clips(24, shortest=1600, longest=16000)
    calls, start = [], 0
    for _ in range(12):
        batch = rng.choice((1, 2))
        features = extractor(audio[start:start + batch], sampling_rate=16000, return_tensors="pt")["input_features"]
        start += batch
        calls.append((features, rng.randint(4, 8)))
    expected = [model.generate(f, max_new_tokens=n) for f, n in calls]
    assert len({tuple(e[0].tolist()) for e in expected}) > 1  # different clips, different transcripts
    model.to("tpu")
    programs = []
    for (features, new), cpu in zip(calls, expected):
        before = simulated_tpu.counters()
        out = model.generate(features.to("tpu"), max_new_tokens=new)
        programs.append((simulated_tpu.counters() - before).programs)
        assert out.device.type == "tpu"  # Whisper's result where upstream's is (patch_whisper_generate)
        assert torch.equal(out.cpu(), cpu)
    # Whisper decodes in upstream's host loop (its timestamp and suppress processors): each (batch, length)
    # of the ids it grows is one eager concatenation. A first-half batch that stopped early leaves a later
    # length unseen (this workload: [2, 8] + [2, 1] in call 9, 1 program); warmup() makes every one (below).
    assert sum(programs[6:]) <= 2, programs
    transformers_tpu_ext.warmup(model, max_prompt_length=1, max_new_tokens=8, batch_sizes=[1, 2])
    for index, ((features, new), cpu) in enumerate(zip(calls, expected)):
        with cache_only(f"whisper call {index}"):
            out = model.generate(features.to("tpu"), max_new_tokens=new)
        assert torch.equal(out.cpu(), cpu)


# -------------------------------------------------------------------------------------------------
# Bad input: the CPU's error, nothing lost


def _error(call):
    try:
        call()
    except Exception as error:  # noqa: BLE001 - compared as the user sees it
        return type(error).__name__, str(error)
    return None


@pytest.mark.parametrize("family", ["llava", "gemma3", "qwen2_vl"])
def test_a_prompt_with_more_image_tokens_than_images_fails_as_on_the_cpu(simulated_tpu, family):
    model, processor = tiny_vlm.tiny_vlm(family)
    image = tiny_vlm.vlm_images(1)
    placeholder = tiny_vlm._PLACEHOLDER[family]
    # The processor refuses it as it always does (the plugin is not involved)...
    rejected = _error(lambda: processor(text=[f"{placeholder} {placeholder} hi"], images=[image], return_tensors="pt"))
    assert rejected is not None and rejected[0] == "ValueError"
    # ... and ids built by hand with one image token too many fail in generate() with the CPU's error.
    good = dict(processor(text=[f"{placeholder} hello world"], images=[image], return_tensors="pt"))
    bad = {name: value.clone() for name, value in good.items()}
    bad["input_ids"][0, -2] = model.config.image_token_id
    for name in ("token_type_ids", "mm_token_type_ids"):
        if name in bad:
            bad[name][0, -2] = 1
    on_cpu = _error(lambda: model.generate(**bad, max_new_tokens=3, do_sample=False))
    model.to("tpu")
    on_tpu = _error(lambda: model.generate(**_on_tpu(bad), max_new_tokens=3, do_sample=False))
    assert on_cpu is not None and on_tpu == on_cpu
    # The model still serves the next, good call.
    model.to("cpu")
    expected = model.generate(**good, max_new_tokens=3, do_sample=False)
    model.to("tpu")
    assert torch.equal(model.generate(**_on_tpu(good), max_new_tokens=3, do_sample=False).cpu(), expected)


def test_an_image_the_processor_rejects_is_the_processors_error(simulated_tpu):
    import numpy as np
    from PIL import Image

    _, processor = tiny_vlm.tiny_vlm("qwen2_vl")
    thin = Image.fromarray(np.zeros((1, 300, 3), dtype=np.uint8))  # Qwen-VL's smart_resize refuses a 300:1 image
    error = _error(lambda: processor(text=["<|vision_start|><|image_pad|><|vision_end|> hi"], images=[[thin]],
                                     return_tensors="pt"))
    assert error is not None and error[0] == "ValueError" and "aspect ratio" in error[1]


def test_audio_longer_than_30_s_without_timestamps_is_whispers_error(simulated_tpu):
    model, _ = tiny_media.tiny_whisper_generation()
    long = torch.randn(1, 16, 45)  # longer than the model's 20 frames ("30 s" for the tiny model)
    on_cpu = _error(lambda: model.generate(long, max_new_tokens=4))
    model.to("tpu")
    on_tpu = _error(lambda: model.generate(long.to("tpu"), max_new_tokens=4))
    assert on_cpu is not None and on_tpu == on_cpu
