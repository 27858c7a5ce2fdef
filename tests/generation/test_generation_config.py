"""Settings of generate() on TPU: one dataclass, environment variables, configure()."""

from __future__ import annotations

import pytest

from transformers_tpu_ext.generation import config as gc


@pytest.fixture(autouse=True)
def _clean(monkeypatch):
    for var in gc.ENV.values():
        monkeypatch.delenv(var, raising=False)
    gc.reset()
    yield
    gc.reset()


def test_defaults():
    settings = gc.current()
    assert settings.static_cache and settings.bucketing and settings.compile_prefill
    assert settings.prompt_ladder() == (16, 32, 64)
    assert settings.plan(3, 100, 40) == (4, 128, 64, 256)


def test_environment_variables(monkeypatch):
    monkeypatch.setenv("TRANSFORMERS_TPU_EXT_GENERATE_PROMPT_BUCKETS", "32, 128")
    monkeypatch.setenv("TRANSFORMERS_TPU_EXT_GENERATE_PREFILL_CHUNK", "128")
    monkeypatch.setenv("TRANSFORMERS_TPU_EXT_GENERATE_BUCKETS", "0")
    monkeypatch.setenv("TRANSFORMERS_TPU_EXT_GENERATE_MAX_CACHE_LEN", "1024")
    settings = gc.current()
    assert settings.prompt_buckets == (32, 128) and settings.prefill_chunk == 128
    assert settings.bucketing is False
    assert settings.plan(1, 40, 8) == (1, 128, 128, 1024)
    monkeypatch.setenv("TRANSFORMERS_TPU_EXT_GENERATE_PREFILL_CHUNK", "0")
    assert gc.current().prefill_chunk is None


def test_configure_wins_over_environment_and_reset_undoes_it(monkeypatch):
    monkeypatch.setenv("TRANSFORMERS_TPU_EXT_GENERATE_STEPS_PER_OCTAVE", "4")
    assert gc.configure(steps_per_octave=2, prefill_chunk=128).prompt_ladder() == (16, 32, 48, 64, 96, 128)
    gc.reset()
    assert gc.current().steps_per_octave == 4


def test_bad_values_say_what_to_fix(monkeypatch):
    monkeypatch.setenv("TRANSFORMERS_TPU_EXT_GENERATE_BUCKETS", "maybe")
    with pytest.raises(ValueError, match="TRANSFORMERS_TPU_EXT_GENERATE_BUCKETS='maybe': use 1 or 0"):
        gc.current()
    monkeypatch.delenv("TRANSFORMERS_TPU_EXT_GENERATE_BUCKETS")
    with pytest.raises(TypeError, match="unknown generation setting"):
        gc.configure(bucket=False)
    with pytest.raises(ValueError, match="prefill_chunk"):
        gc.configure(prefill_chunk=-1)
    assert gc.current().prefill_chunk == 64  # nothing stored
