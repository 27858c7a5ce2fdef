"""Issue 29: one settings layer. Each mistake a user made is one test; all in-process, milliseconds."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from transformers_tpu_ext import config, settings
from transformers_tpu_ext.compilation import cache, guard
from transformers_tpu_ext.generation import config as generation_config
from transformers_tpu_ext.registry import CAPABILITIES
from transformers_tpu_ext.serving import settings as serving
from transformers_tpu_ext.training import buckets as training

ROOT = Path(settings.__file__).parents[2]


def test_an_unknown_name_is_one_warning_naming_the_closest_known_one():
    # the recompile guard's name before its rename did nothing and said nothing
    (problem,) = settings.problems({"TRANSFORMERS_TPU_EXT_ON_RECOMPILE": "error"})
    assert problem.startswith("TRANSFORMERS_TPU_EXT_ON_RECOMPILE is not a transformers-tpu-ext setting")
    assert "did you mean TRANSFORMERS_TPU_EXT_COMPILE_ON_RECOMPILE?" in problem
    (problem,) = settings.problems({"TRANSFORMERS_TPU_EXT_SERVE_MAX_REQUEST": "8"})
    assert "did you mean TRANSFORMERS_TPU_EXT_SERVE_MAX_REQUESTS?" in problem
    # other prefixes are not ours; the renamed names keep their own (rename) warning, and still work
    assert settings.problems({"TRANSFORMERS_VERBOSITY": "info", "TORCH_TPU_X": "1"}) == []
    (problem,) = settings.problems({"TRANSFORMERS_TPU_EXT_PROMPT_BUCKETS": "32,64"})
    assert "was renamed TRANSFORMERS_TPU_EXT_GENERATE_PROMPT_BUCKETS" in problem
    assert generation_config.current({"TRANSFORMERS_TPU_EXT_PROMPT_BUCKETS": "32,64"}).prompt_buckets == (32, 64)


def test_an_unknown_name_is_warned_once_per_process(recwarn):
    environ = {"TRANSFORMERS_TPU_EXT_GENRATE_BUCKETS": "0"}
    settings.warn_about_problems(environ)
    settings.warn_about_problems(environ)
    texts = [str(w.message) for w in recwarn if "GENRATE_BUCKETS" in str(w.message)]
    assert len(texts) == 1 and "did you mean TRANSFORMERS_TPU_EXT_GENERATE_BUCKETS?" in texts[0]


@pytest.mark.parametrize("raw", ["of", "Of", "offf", "disbale", "nope", "tru"])
def test_a_near_miss_of_a_word_never_becomes_a_cache_directory(raw):
    environ = {cache.CACHE_ENV: raw}
    assert cache.parse_setting(raw) == "invalid"
    result = cache.plan(environ, cache.Facts("0.2.0", True, home="/home/u", cwd="/work"), lambda path: True)
    assert (result.action, result.case, result.root) == ("off", "invalid", None)
    (problem,) = settings.problems(environ)
    assert f"{cache.CACHE_ENV}={raw!r}" in problem and "did you mean" in problem and "not taken for a directory" in problem


@pytest.mark.parametrize("raw, parsed", [("disable", "off"), ("DISABLED", "off"), ("none", "off"), ("enable", "on"),
                                         ("enabled", "on"), ("./of", "./of"), ("cache", "cache"), ("/tmp/off", "/tmp/off"),
                                         ("gs://bucket/c", "gs://bucket/c")])
def test_every_word_and_every_path_of_the_compile_cache(raw, parsed):
    assert cache.parse_setting(raw) == parsed
    assert settings.problems({cache.CACHE_ENV: raw}) == []


@pytest.mark.parametrize("on", sorted(settings.ON_WORDS) + ["ON", "Enabled"])
def test_one_vocabulary_of_on_words_for_every_switch(on):
    assert generation_config.current({generation_config.ENV["static_cache"]: on}).static_cache is True
    assert serving.current({serving.ENV["warmup"]: on}).warmup is True
    assert training.settings({training.ENV["buckets"]: on}).enabled is True
    assert cache.parse_setting(on) == "on"
    assert config.disabled_patches({config.DISABLE_ENV: on}) is None


@pytest.mark.parametrize("off", sorted(settings.OFF_WORDS) + ["OFF", "Disabled"])
def test_one_vocabulary_of_off_words_for_every_switch(off):
    # "=enabled" worked for the compile cache and was refused for the generate static cache
    assert generation_config.current({generation_config.ENV["static_cache"]: off}).static_cache is False
    assert serving.current({serving.ENV["warmup"]: off}).warmup is False
    assert training.settings({training.ENV["buckets"]: off}).enabled is False
    assert cache.parse_setting(off) == "off"
    assert config.disabled_patches({config.DISABLE_ENV: off}) == frozenset()


def test_a_near_miss_of_a_switch_word_names_the_word_meant():
    with pytest.raises(ValueError, match=r"TRANSFORMERS_TPU_EXT_GENERATE_STATIC_CACHE='of' \(did you mean off\?\)"):
        generation_config.current({generation_config.ENV["static_cache"]: "of"})
    (problem,) = settings.problems({guard.ENV["on_recompile"]: "eror"})
    assert "did you mean error?" in problem


def test_every_serving_mistake_is_reported_at_once():
    environ = {serving.ENV["max_len"]: "0", serving.ENV["warmup"]: "maybe", serving.ENV["page_size"]: "x",
               serving.ENV["request_buckets"]: "8,64"}
    problems = serving.check_environment(environ)
    assert len(problems) == 4
    for name in ("max_len", "warmup", "page_size", "request_buckets"):
        assert sum(serving.ENV[name] in p for p in problems) >= 1
    with pytest.raises(ValueError) as raised:
        serving.current(environ)
    assert all(p in str(raised.value) for p in problems)


def test_every_training_mistake_is_reported_at_once():
    environ = {training.ENV["buckets"]: "x", training.ENV["reuse"]: "0.5", training.ENV["steps_per_octave"]: "0"}
    problems = settings.problems(environ)
    assert len(problems) == 3 and all(any(var in p for p in problems) for var in environ)
    with pytest.raises(ValueError) as raised:
        training.settings(environ)
    assert all(p in str(raised.value) for p in problems)


def test_every_mistake_of_every_capability_in_one_list():
    environ = {serving.ENV["max_len"]: "0", training.ENV["reuse"]: "x", guard.ENV["settle"]: "-1",
               generation_config.ENV["bucketing"]: "maybe", cache.CACHE_ENV: "of", "TRANSFORMERS_TPU_EXT_TP_REWRIT": "1"}
    problems = settings.problems(environ)
    assert len(problems) == 6


def test_the_request_buckets_message_names_the_request_buckets_variable():
    (problem,) = serving.check_environment({serving.ENV["request_buckets"]: "8,64"})
    assert problem.startswith("TRANSFORMERS_TPU_EXT_SERVE_REQUEST_BUCKETS='8,64' goes past")
    assert "leave 64 out" in problem and "TRANSFORMERS_TPU_EXT_SERVE_MAX_REQUESTS" in problem


def test_the_guard_and_the_compile_cache_page_name_current_variables_only():
    texts = [
        guard.generate_advice(2, 40, 3, {}),
        guard.generate_advice(1, 10, 2, {"max_prompt_length": 16, "max_new_tokens": 3, "max_batch_size": 1, "cache": 64},
                              cache=512),
        guard.serve_advice(300, 3, None, [(16, 8)]),
        guard.train_advice(2, 100, []),
        (ROOT / "docs" / "compile-cache.md").read_text(),
    ]
    used = {name for text in texts for name in re.findall(r"TRANSFORMERS_TPU_EXT_[A-Z0-9_]*[A-Z0-9]", text)}
    assert used and not used & set(config.RENAMED), sorted(used & set(config.RENAMED))
    assert used <= settings.known_names() | {"TRANSFORMERS_TPU_EXT_SERVE"}


def test_each_setting_is_declared_once_in_its_capability_folder():
    declared = settings.declared()
    assert list(declared)[0] == "plugin" and set(declared) - {"plugin"} <= set(CAPABILITIES)
    names = [s.name for group in declared.values() for s in group]
    assert len(names) == len(set(names))
    assert all(name.startswith(settings.PREFIX) for name in names)
    # the capabilities' ENV tables are built from the declarations, not written twice
    assert set(serving.ENV.values()) <= set(names) and set(generation_config.ENV.values()) <= set(names)
    assert set(training.ENV.values()) <= set(names) and set(guard.ENV.values()) <= set(names)
    # every variable the package reads is declared (or renamed, or a script's own)
    read = set()
    for path in (ROOT / "transformers_tpu_ext").rglob("*.py"):
        read |= set(re.findall(r"TRANSFORMERS_TPU_EXT_[A-Z][A-Z0-9_]*[A-Z0-9]", path.read_text()))
    stems = {"TRANSFORMERS_TPU_EXT_" + p.rstrip("_") for p in config.SCHEME_PREFIXES}
    assert read - stems <= settings.known_names()


def test_the_settings_layer_is_pure():
    import subprocess
    import sys

    code = ("import sys; from transformers_tpu_ext import settings; settings.declared(); "
            "settings.problems({}); print(sorted(m for m in ('torch', 'transformers', 'accelerate') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={"PYTHONPATH": str(ROOT), "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}, check=True).stdout
    assert out.strip() == "[]"


def test_the_docs_table_is_the_declarations():
    text = (ROOT / "docs" / "configuration.md").read_text()
    begin = text.index(settings.BEGIN) + len(settings.BEGIN)
    end = text.index(settings.END, begin)
    assert text[begin:end].strip() == settings.settings_table(), "run: python scripts/gen_docs_tables.py"
