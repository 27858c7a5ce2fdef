"""The recompile guard on the simulated TPU: generate(), continuous-batching steps, training steps.

A context-sensitive tiny model; every call is checked against the CPU where tokens matter. The
guard is silent in steady state, names the setting that covers a call that compiles, fails in
``error`` mode before the program compiles (cache-only), and counts on its own where the backend
has no statistics.
"""

from __future__ import annotations

import logging

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import transformers_tpu_ext as ext  # noqa: E402
from transformers_tpu_ext import compilation  # noqa: E402
from transformers_tpu_ext.compilation import recompile  # noqa: E402
from transformers_tpu_ext.testing import tiny  # noqa: E402


@pytest.fixture
def guard_settings():
    """Each test starts from the default settings and a guard that knows no model."""
    compilation.reset()
    recompile.reset()
    ext.activate()
    yield compilation
    compilation.reset()
    recompile.reset()


@pytest.fixture(scope="module")
def reference():
    """A context-sensitive model and its CPU tokens for the calls below."""
    model = tiny.tiny_model("qwen3", seed=0)
    tiny.check_context_sensitive(model)
    return model


def _reports(caplog):
    return [r.getMessage() for r in caplog.records if "compiled" in r.getMessage() and r.levelno == logging.WARNING]


def _prompts(count, low, high, seed=0):
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(low, high + 1, (count,), generator=gen).tolist()
    return [torch.randint(2, 300, (1, n), generator=gen) for n in lengths]


def test_generate_silent_over_100_steady_state_calls_then_names_the_warmup_that_covers_a_longer_prompt(
    simulated_tpu, guard_settings, reference, caplog
):
    model = tiny.tiny_model("qwen3", seed=0).to("tpu")
    ext.warmup(model, max_prompt_length=16, max_new_tokens=3)
    before = simulated_tpu.counters()
    with caplog.at_level(logging.WARNING, logger="transformers_tpu_ext"):
        for i, ids in enumerate(_prompts(100, 1, 16)):
            out = model.generate(ids.to("tpu"), max_new_tokens=1 + i % 3, do_sample=False)
            if i % 25 == 0:  # the tokens are the CPU's (the guard changes nothing it watches)
                expected = reference.generate(ids, max_new_tokens=1 + i % 3, do_sample=False)
                assert torch.equal(out.cpu(), expected)
    assert (simulated_tpu.counters() - before).programs == 0
    assert _reports(caplog) == []
    long = torch.randint(2, 300, (2, 40), generator=torch.Generator().manual_seed(1))
    with caplog.at_level(logging.WARNING, logger="transformers_tpu_ext"):
        out = model.generate(long.to("tpu"), max_new_tokens=3, do_sample=False)
    assert torch.equal(out.cpu(), reference.generate(long, max_new_tokens=3, do_sample=False))
    (report,) = _reports(caplog)
    assert report.startswith("transformers-tpu-ext: generate() compiled ") and "after its warm-up" in report
    assert "a batch of 2 prompts of 40 tokens, max_new_tokens=3" in report
    assert "warmup(model, max_prompt_length=40, max_new_tokens=3, max_batch_size=2)" in report
    assert "TRANSFORMERS_TPU_EXT_GENERATE_PROMPT_BUCKETS" in report


def test_error_mode_fails_before_compiling_and_leaves_the_model_usable(simulated_tpu, guard_settings, reference):
    model = tiny.tiny_model("qwen3", seed=0).to("tpu")
    ext.warmup(model, max_prompt_length=16, max_new_tokens=3)
    guard_settings.configure(on_recompile="error")
    long = torch.randint(2, 300, (1, 40), generator=torch.Generator().manual_seed(2))
    before = simulated_tpu.counters()
    with pytest.raises(compilation.RecompileError, match=r"warmup\(model, max_prompt_length=40") as raised:
        model.generate(long.to("tpu"), max_new_tokens=3, do_sample=False)
    assert "no more compilation should happen" in str(raised.value.__cause__)  # torch_tpu's cache-only error
    assert (simulated_tpu.counters() - before).programs == 0  # failed before compiling anything
    assert simulated_tpu.compile_cache.cache_only is False  # switched off again
    short = torch.randint(2, 300, (1, 7), generator=torch.Generator().manual_seed(3))
    out = model.generate(short.to("tpu"), max_new_tokens=2, do_sample=False)  # within the warm-up: runs
    assert torch.equal(out.cpu(), reference.generate(short, max_new_tokens=2, do_sample=False))


def test_without_backend_statistics_the_guard_counts_on_its_own(simulated_tpu, guard_settings, monkeypatch, caplog):
    # Another TPU backend with torch_tpu's public surface but none of its private cache functions.
    for name in ("_get_cache_misses", "_set_cache_only"):
        monkeypatch.delattr(torch.tpu, name)
    model = tiny.tiny_model("qwen3", seed=0).to("tpu")
    ext.warmup(model, max_prompt_length=16, max_new_tokens=3)
    with caplog.at_level(logging.WARNING, logger="transformers_tpu_ext"):
        for ids in _prompts(6, 1, 16, seed=4):
            model.generate(ids.to("tpu"), max_new_tokens=2, do_sample=False)
        assert _reports(caplog) == []
        long = torch.randint(2, 300, (1, 40), generator=torch.Generator().manual_seed(5))
        model.generate(long.to("tpu"), max_new_tokens=2, do_sample=False)
    (report,) = _reports(caplog)
    assert "warmup(model, max_prompt_length=40" in report
    guard_settings.configure(on_recompile="error")
    longer = torch.randint(2, 300, (1, 100), generator=torch.Generator().manual_seed(6))
    with pytest.raises(compilation.RecompileError, match="max_prompt_length=100"):
        model.generate(longer.to("tpu"), max_new_tokens=2, do_sample=False)


def test_without_a_warmup_the_guard_watches_after_the_settle_period(simulated_tpu, guard_settings, caplog):
    guard_settings.configure(settle=3)
    model = tiny.tiny_model("qwen3", seed=0).to("tpu")
    with caplog.at_level(logging.WARNING, logger="transformers_tpu_ext"):
        for ids in _prompts(5, 1, 16, seed=7):
            model.generate(ids.to("tpu"), max_new_tokens=2, do_sample=False)
        assert _reports(caplog) == []  # compiling while it settles is expected
        assert recompile.state("generate", model).steady == "settle"
        long = torch.randint(2, 300, (1, 40), generator=torch.Generator().manual_seed(8))
        model.generate(long.to("tpu"), max_new_tokens=2, do_sample=False)
    (report,) = _reports(caplog)
    assert "in steady state" in report and "Nothing warmed generate() up" in report
    other = tiny.tiny_model("llama", seed=1).to("tpu")  # another model has its own state: it settles first
    with caplog.at_level(logging.WARNING, logger="transformers_tpu_ext"):
        other.generate(long.to("tpu"), max_new_tokens=2, do_sample=False)
    assert len(_reports(caplog)) == 1


def test_ignore_and_no_tpu_leave_the_call_alone(simulated_tpu, guard_settings, caplog):
    guard_settings.configure(on_recompile="ignore", settle=0)
    model = tiny.tiny_model("qwen3", seed=0).to("tpu")
    with caplog.at_level(logging.WARNING, logger="transformers_tpu_ext"):
        for ids in _prompts(3, 10, 60, seed=9):
            model.generate(ids.to("tpu"), max_new_tokens=2, do_sample=False)
        cpu = tiny.tiny_model("qwen3", seed=0)
        guard_settings.configure(on_recompile="error")
        cpu.generate(torch.ones(1, 5, dtype=torch.long), max_new_tokens=2)  # not on the TPU: not watched
    assert _reports(caplog) == []
    assert recompile.state("generate", cpu).steady is None


def test_serving_steps_after_the_warmup_are_watched(simulated_tpu, guard_settings, caplog, monkeypatch):
    from transformers import GenerationConfig

    monkeypatch.setenv("TRANSFORMERS_TPU_EXT_SERVE_MAX_BATCH_TOKENS", "16")
    monkeypatch.setenv("TRANSFORMERS_TPU_EXT_SERVE_MAX_REQUESTS", "4")
    simulated_tpu.configure(chips=1, hbm_bytes="96MiB")
    model = tiny.tiny_model("qwen3", seed=0).to("tpu")
    config = GenerationConfig(do_sample=False, eos_token_id=1, pad_token_id=0, max_new_tokens=3)
    manager = ext.warmup(model, work="serve", generation_config=config)
    assert recompile.state("serve", model).steady == "warmup"
    manager.start()
    try:
        with caplog.at_level(logging.WARNING, logger="transformers_tpu_ext"):
            for ids in _prompts(4, 2, 10, seed=10):
                manager.add_request(ids[0].tolist(), max_new_tokens=3)
            results = [manager.get_result(timeout=120) for _ in range(4)]
            assert all(r is not None for r in results)
            assert _reports(caplog) == []
            torch._dynamo.reset()  # TorchDynamo forgot the step graphs: the next step compiles again
            manager.add_request([5, 6, 7], max_new_tokens=2)
            assert manager.get_result(timeout=120) is not None
    finally:
        manager.stop(block=True)
    reports = _reports(caplog)
    assert reports and reports[0].startswith("transformers-tpu-ext: a continuous-batching step compiled")
    assert "padded to tokens=" in reports[0] and "was warmed up, so something else made a new program" in reports[0]


def test_training_steps_after_the_warmup_are_watched(simulated_tpu, guard_settings, caplog, tmp_path):
    from transformers import DataCollatorForLanguageModeling, Trainer, TrainingArguments

    from transformers_tpu_ext.training import warmup as training_warmup

    tokenizer = tiny.tiny_tokenizer()
    tokenizer.padding_side = "right"
    data = tiny.tiny_lm_dataset(num_examples=16, min_length=8, max_length=60)
    args = TrainingArguments(
        output_dir=str(tmp_path), per_device_train_batch_size=4, max_steps=4, report_to=[], save_strategy="no",
        disable_tqdm=True, logging_steps=100,
    )
    trainer = Trainer(model=tiny.tiny_model("qwen3", seed=0), args=args, train_dataset=data,
                      data_collator=DataCollatorForLanguageModeling(tokenizer, mlm=False))
    training_warmup(trainer, lengths=[16, 32])  # leaves out the 48- and 64-token buckets the data needs
    with caplog.at_level(logging.WARNING, logger="transformers_tpu_ext"):
        trainer.train()
    assert recompile.state("train", trainer).steady == "warmup"
    reports = _reports(caplog)
    assert reports and all(r.startswith("transformers-tpu-ext: a training step compiled") for r in reports)
    assert any("training.warmup(trainer, max_length=" in r and "TRANSFORMERS_TPU_EXT_TRAIN_BUCKETS" in r for r in reports)
    assert any("input_ids 4x" in r for r in reports)
