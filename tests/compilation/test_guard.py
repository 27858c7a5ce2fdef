"""The recompile guard's decisions (pure: ``compilation.guard``): settings, steady state, advice."""

from __future__ import annotations

import pytest

from transformers_tpu_ext.compilation import guard


@pytest.fixture(autouse=True)
def _no_overrides():
    guard.reset()
    yield
    guard.reset()


def test_defaults_environment_and_configure():
    assert guard.current({}) == guard.GuardSettings("warn", 20)
    env = {"TRANSFORMERS_TPU_EXT_COMPILE_ON_RECOMPILE": "Error", "TRANSFORMERS_TPU_EXT_COMPILE_RECOMPILE_SETTLE": "3"}
    assert guard.current(env) == guard.GuardSettings("error", 3)
    guard.configure(on_recompile="ignore")
    assert guard.current(env).on_recompile == "ignore"  # configure() wins over the environment
    with pytest.raises(ValueError):
        guard.configure(on_recompile="loud")
    assert guard.current(env).on_recompile == "ignore"  # a refused change leaves the settings as they were
    with pytest.raises(TypeError, match="unknown recompile guard setting"):
        guard.configure(mode="error")


@pytest.mark.parametrize(
    "environ, variable",
    [
        ({"TRANSFORMERS_TPU_EXT_COMPILE_ON_RECOMPILE": "fail"}, "TRANSFORMERS_TPU_EXT_COMPILE_ON_RECOMPILE"),
        ({"TRANSFORMERS_TPU_EXT_COMPILE_RECOMPILE_SETTLE": "-1"}, "TRANSFORMERS_TPU_EXT_COMPILE_RECOMPILE_SETTLE"),
        ({"TRANSFORMERS_TPU_EXT_COMPILE_RECOMPILE_SETTLE": "soon"}, "TRANSFORMERS_TPU_EXT_COMPILE_RECOMPILE_SETTLE"),
    ],
)
def test_invalid_values_name_their_variable(environ, variable):
    problems = guard.check_environment(environ)
    assert len(problems) == 1 and variable in problems[0]
    with pytest.raises(ValueError, match=variable):
        guard.current(environ)


def test_the_settings_checks_include_the_guard():
    from transformers_tpu_ext import settings

    problems = settings.problems({"TRANSFORMERS_TPU_EXT_COMPILE_ON_RECOMPILE": "fail"})
    assert any("TRANSFORMERS_TPU_EXT_COMPILE_ON_RECOMPILE" in p for p in problems)


def test_steady_state_after_settle_quiet_calls_then_every_new_program_is_reported():
    state = guard.WorkState()
    assert [guard.observe(state, n, settle=3) for n in (5, 0, 2, 0, 0)] == [False] * 5
    assert state.steady is None and state.quiet == 2  # the compile at call 3 restarted the count
    assert guard.observe(state, 0, settle=3) is False and state.steady == "settle"
    assert [guard.observe(state, n, settle=3) for n in (0,) * 100] == [False] * 100
    assert guard.observe(state, 1, settle=3) is True and state.reported == 1


def test_a_warm_up_puts_the_work_in_steady_state_and_its_own_calls_are_never_reported():
    state = guard.WorkState()
    state.warming = 1
    assert guard.observe(state, 7, settle=0) is False
    state.warming = 0
    guard.warmed_up(state, {"max_prompt_length": 64})
    assert state.steady == "warmup" and state.covered == {"max_prompt_length": 64}
    assert guard.observe(state, 0, settle=20) is False
    assert guard.observe(state, 2, settle=20) is True


def test_settle_zero_watches_from_the_first_call():
    state = guard.WorkState()
    assert guard.observe(state, 3, settle=0) is False  # the first call is what makes the state
    assert guard.observe(state, 1, settle=0) is True


def test_generate_advice_names_the_warmup_that_covers_the_call():
    covered = {"max_prompt_length": 64, "max_new_tokens": 16, "max_batch_size": 2, "cache": 128}
    outside = guard.generate_advice(3, 200, 48, covered)
    assert "warmup(model, max_prompt_length=200, max_new_tokens=48, max_batch_size=3)" in outside
    assert "--max-prompt-length 200 --max-new-tokens 48 --max-batch-size 3" in outside
    assert "TRANSFORMERS_TPU_EXT_GENERATE_PROMPT_BUCKETS" in outside and "Outside the warm-up" in outside
    inside = guard.generate_advice(1, 30, 8, covered, cache=128)
    assert "within what the warm-up covered" in inside and "options" in inside
    grown = guard.generate_advice(1, 30, 8, covered, cache=512)
    assert "512 positions, past the warm-up's 128" in grown and "TRANSFORMERS_TPU_EXT_GENERATE_MAX_CACHE_LEN" in grown
    sampling = guard.generate_advice(3, 30, 8, {**covered, "batch_sizes": [1, 2]}, sampling=True)
    assert "batch_sizes=[3]" in sampling and "--batch-sizes 3" in sampling
    cold = guard.generate_advice(2, 10, 4, {})
    assert cold.startswith("Nothing warmed generate() up") and "max_prompt_length=10" in cold


def test_serve_and_train_advice():
    shapes = [(16, 8), (32, 8)]
    assert "TRANSFORMERS_TPU_EXT_SERVE_TOKEN_BUCKETS" in guard.serve_advice(64, 9, (64, 16), shapes)
    assert "was warmed up" in guard.serve_advice(16, 3, (16, 8), shapes)
    advice = guard.train_advice(4, 96, [16, 32, 48, 64])
    assert "training.warmup(trainer, max_length=96)" in advice and "TRANSFORMERS_TPU_EXT_TRAIN_BUCKETS" in advice
    assert "were warmed up" in guard.train_advice(4, 32, [16, 32])
    assert "TRANSFORMERS_TPU_EXT_TRAIN_BUCKETS" in guard.train_advice(4, None, [])


def test_the_message_says_what_compiled_the_call_the_advice_and_how_to_silence_it():
    text = guard.message("generate", guard.programs_text(3, 1), "a batch of 1", "Do this", "warmup", "warn")
    assert text.startswith("transformers-tpu-ext: generate() compiled 3 new programs (1 torch.compile graph, 2 eager operations)")
    assert "after its warm-up: a batch of 1. Do this" in text and "TRANSFORMERS_TPU_EXT_COMPILE_ON_RECOMPILE=ignore" in text
    assert guard.programs_text(1, None) == "1 new program"
    assert "in steady state" in guard.message("train", "x", "y", "z", "settle", "error")


def test_the_training_guard_describes_a_batch_of_tensors_and_a_trainers_own_examples():
    torch = pytest.importorskip("torch")
    from transformers_tpu_ext.training.patch_recompile_guard_train import _facts

    batch = _facts({"input_ids": torch.zeros(4, 48, dtype=torch.long), "labels": torch.zeros(4, 48, dtype=torch.long)}, {})
    assert batch.call == "a batch of input_ids 4x48, labels 4x48" and "48" in batch.advice
    # TRL's GRPOTrainer hands training_step the dataset's examples; describing them must not fail
    examples = _facts([{"prompt": "a"}, {"prompt": "b"}], {})
    assert examples.call == "a batch of 2 examples" and "GRPOTrainer" in examples.advice
