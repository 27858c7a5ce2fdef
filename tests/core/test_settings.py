"""Settings are validated up front, each message naming its variable; versions are gated per library.

In-process and fast: the checks are plain functions over an environment dict. What a user sees at
``import torch`` (one warning each, ``-W error``, verbosity) is in ``test_ready_subprocess.py``.
"""

from __future__ import annotations

import logging
import warnings

import pytest

import transformers_tpu_ext as ext
from transformers_tpu_ext import activation, config, log, settings
from transformers_tpu_ext.core import versions
from transformers_tpu_ext.generation import config as generation_config
from transformers_tpu_ext.registry import REGISTRY
from transformers_tpu_ext.testing import chips


def _one(environ: dict[str, str]) -> str:
    (problem,) = settings.problems(environ)
    return problem


def test_a_clean_environment_has_no_problems():
    assert settings.problems({}) == []
    assert settings.problems({"TRANSFORMERS_TPU_EXT_DISABLE": "generation,hub_kernels"}) == []
    assert settings.problems({"TRANSFORMERS_TPU_EXT_SIMULATE": "chips=8,generation=v5e,hbm=1GiB"}) == []
    assert settings.problems({"TRANSFORMERS_TPU_EXT_SIMULATE": "0"}) == []


def test_an_unknown_patch_name_in_disable_lists_the_valid_names():
    problem = _one({"TRANSFORMERS_TPU_EXT_DISABLE": "generate"})
    assert "TRANSFORMERS_TPU_EXT_DISABLE='generate'" in problem and "'generate'" in problem
    assert all(name in problem for name in REGISTRY)
    assert settings.problems({"TRANSFORMERS_TPU_EXT_DISABLE": "1"}) == []


@pytest.mark.parametrize("off", ["0", "false", "no", "off", "OFF"])
def test_disable_set_to_off_disables_nothing_and_warns_nothing(off):
    from transformers_tpu_ext import config

    assert config.disabled_patches({"TRANSFORMERS_TPU_EXT_DISABLE": off}) == frozenset()
    assert settings.problems({"TRANSFORMERS_TPU_EXT_DISABLE": off}) == []


def test_a_later_serving_call_raises_the_message_that_names_the_variable():
    from transformers_tpu_ext.serving import policy as serving

    environ = {"TRANSFORMERS_TPU_EXT_SERVE_MAX_LEN": "0"}
    (problem,) = settings.problems(environ)
    with pytest.raises(ValueError) as raised:
        serving.current(environ)
    assert "TRANSFORMERS_TPU_EXT_SERVE_MAX_LEN='0'" in str(raised.value) and str(raised.value) == problem


@pytest.mark.parametrize(
    "spec, expected",
    [
        ("garbage", "not key=value"),
        ("chips=4,colour=blue", "unknown key 'colour'"),
        ("chips=banana", "bad chips 'banana'"),
        ("hbm=lots", "bad hbm 'lots'"),
        ("untie_on_move=maybe", "bad untie_on_move"),
        ("chips=3,generation=v6e", "v6e host has 1, 4 or 8 chips"),
        ("chips=1,generation=v7", "v7 host has 2, 4 or 8 chips"),
    ],
)
def test_a_bad_simulate_value_names_the_variable_and_the_keys(spec, expected):
    problem = _one({"TRANSFORMERS_TPU_EXT_SIMULATE": spec})
    assert f"TRANSFORMERS_TPU_EXT_SIMULATE={spec!r}" in problem
    assert expected in problem
    assert "not installed; the plugin itself is active" in problem
    assert "goes on without the plugin" not in problem
    with pytest.raises(ValueError, match="TRANSFORMERS_TPU_EXT_SIMULATE"):
        chips.parse_spec(spec)


def test_simulate_accepts_every_host_the_backend_can_launch_on():
    for generation, chip in chips.CHIPS.items():
        for count in chip.topologies:
            assert chips.parse_spec(f"chips={count},generation={generation}") == {"chips": count, "generation": generation}
    assert chips.parse_spec("generation=v99") == {"generation": "v99"}  # a chip torch_tpu does not know
    assert chips.parse_spec("1") == {}
    assert not chips.simulate_requested("0") and not chips.simulate_requested(" ") and chips.simulate_requested("1")


def test_install_refuses_a_host_without_a_topology():
    with pytest.raises(ValueError, match=r"v6e host has 1, 4 or 8 chips .*, not 3"):
        from transformers_tpu_ext import testing

        testing.install(chips=3, generation="v6e")


@pytest.mark.parametrize(
    "variable, value",
    [
        ("TRANSFORMERS_TPU_EXT_GENERATE_STEPS_PER_OCTAVE", "0"),
        ("TRANSFORMERS_TPU_EXT_GENERATE_PROMPT_BUCKETS", "32,0"),
        ("TRANSFORMERS_TPU_EXT_GENERATE_BATCH_BUCKETS", "a,b"),
        ("TRANSFORMERS_TPU_EXT_GENERATE_STATIC_CACHE", "maybe"),
        ("TRANSFORMERS_TPU_EXT_GENERATE_MAX_CACHE_LEN", "-5"),
        ("TRANSFORMERS_TPU_EXT_HBM_HEADROOM", "lots"),
        ("TRANSFORMERS_TPU_EXT_TP_REWRITE", "sometimes"),
        ("TRANSFORMERS_TPU_EXT_VERBOSITY", "loud"),
        ("TRANSFORMERS_TPU_EXT_GENERATE_DEVICE_DECODE", "perhaps"),
        ("TRANSFORMERS_TPU_EXT_SERVE_TOKEN_BUCKETS", "16,x"),
        ("TRANSFORMERS_TPU_EXT_SERVE_MAX_REQUESTS", "0"),
        ("TRANSFORMERS_TPU_EXT_SERVE_WARMUP", "maybe"),
        ("TRANSFORMERS_TPU_EXT_TRAIN_BUCKETS", "abc"),
        ("TRANSFORMERS_TPU_EXT_TRAIN_STEPS_PER_OCTAVE", "0"),
        ("TRANSFORMERS_TPU_EXT_TRAIN_REUSE", "0.5"),
    ],
)
def test_every_invalid_variable_is_named(variable, value):
    assert variable in _one({variable: value})


def test_generate_names_the_bucket_variable_too(monkeypatch):
    # Before: "TPUGenerationConfig.steps_per_octave must be a positive integer", at the first generate().
    monkeypatch.setenv("TRANSFORMERS_TPU_EXT_GENERATE_STEPS_PER_OCTAVE", "0")
    with pytest.raises(ValueError, match="TRANSFORMERS_TPU_EXT_GENERATE_STEPS_PER_OCTAVE='0'"):
        generation_config.current()


def test_activation_warns_once_per_problem(monkeypatch):
    monkeypatch.setenv("TRANSFORMERS_TPU_EXT_DISABLE", "generate")
    monkeypatch.setenv("TRANSFORMERS_TPU_EXT_GENERATE_PREFILL_CHUNK", "-1")
    monkeypatch.setattr(settings, "_warned", set())
    was_active = ext.is_active()
    ext.deactivate()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            ext.activate()
            ext.deactivate()
            ext.activate()
    finally:
        monkeypatch.delenv("TRANSFORMERS_TPU_EXT_DISABLE")
        ext.deactivate()
        if was_active:
            ext.activate()
    messages = [str(w.message) for w in caught if issubclass(w.category, ext.TransformersTPUExtWarning)]
    assert len(messages) == 2, messages
    assert any("TRANSFORMERS_TPU_EXT_DISABLE" in m for m in messages)
    assert any("TRANSFORMERS_TPU_EXT_GENERATE_PREFILL_CHUNK" in m for m in messages)


# --------------------------------------------------------------------------------------------------
# Versions: allowed, tested, gated once per library


def test_ranges_are_wide_and_the_tested_releases_lie_inside_them():
    assert versions.supported_range("transformers").contains("5.99.0")  # up to the next major
    assert not versions.supported_range("transformers").contains("6.0.0")
    assert versions.supported_range("torch").contains("2.15.0")  # as wide as torch-tpu 0.2.0 allows
    for dist, tested in versions.TESTED.items():
        assert len(tested) >= 2, dist
        assert all(versions.supported_range(dist).contains(v) for v in tested), dist


def test_untested_names_the_installed_and_the_tested_releases(monkeypatch):
    monkeypatch.setattr(versions, "installed_version", lambda dist: "5.30.0")
    note = versions.untested("transformers")
    assert note and "transformers 5.30.0" in note and all(v in note for v in versions.tested_versions("transformers"))
    monkeypatch.setattr(versions, "installed_version", lambda dist: "5.24.2")
    assert versions.untested("transformers") is None  # a patch release of the newest tested one
    assert versions.version_gate("transformers") is None


@pytest.fixture
def fake_transformers_patches(tmp_path, monkeypatch):
    """Three fake patches gated on "transformers", on fake target modules, through real activation."""
    import sys
    import types
    import uuid

    from transformers_tpu_ext.core.wrapping import Wraps

    patches = {}
    for index in range(3):
        target = f"tpu_ext_fake_{uuid.uuid4().hex[:8]}"
        (tmp_path / f"{target}.py").write_text("def f():\n    return 1\n")
        patch = types.ModuleType(f"fake_{index}")
        patch.NAME, patch.TARGET, patch.DISTRIBUTION = f"fake_{index}", target, "transformers"
        wraps = Wraps()
        patch.apply = lambda module, wraps=wraps: wraps.wrap(module, "f", lambda w, i, a, k: w(*a, **k) + 1)
        patch.revert = wraps.unwrap_all
        patches[patch.NAME] = patch
    monkeypatch.syspath_prepend(str(tmp_path))
    was_active = activation.is_active()
    activation._reset()
    monkeypatch.setattr(activation.registry, "REGISTRY", tuple(patches))
    monkeypatch.setattr(activation, "_patch_module", lambda name: patches[name])
    monkeypatch.delenv("TRANSFORMERS_TPU_EXT_DISABLE", raising=False)
    yield patches
    activation._reset()
    monkeypatch.undo()
    for patch in patches.values():
        sys.modules.pop(patch.TARGET, None)
    if was_active:
        activation.activate()


def test_a_library_outside_its_range_is_one_warning_for_all_its_patches(fake_transformers_patches, monkeypatch):
    import importlib

    monkeypatch.setattr(versions, "installed_version", lambda dist: "6.1.0")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        activation.activate()
        for patch in fake_transformers_patches.values():
            importlib.import_module(patch.TARGET)
    ours = [str(w.message) for w in caught if issubclass(w.category, ext.TransformersTPUExtWarning)]
    assert len(ours) == 1, ours
    assert "transformers 6.1.0 is installed" in ours[0] and ">=5.23,<6" in ours[0]
    assert all(name in ours[0] for name in fake_transformers_patches)
    assert "tested with transformers" in ours[0]
    assert set(activation.status().values()) == {"skipped"}
    assert set(activation.skipped_patches()) == set(fake_transformers_patches)


def test_an_untested_release_applies_patches_and_names_versions_when_one_fails(fake_transformers_patches, monkeypatch, caplog):
    import importlib

    monkeypatch.setattr(versions, "installed_version", lambda dist: "5.31.0")
    broken = fake_transformers_patches["fake_1"]
    broken.apply = lambda module: (_ for _ in ()).throw(AttributeError("module has no attribute 'f'"))
    with warnings.catch_warnings(record=True) as caught, caplog.at_level(logging.INFO, logger="transformers_tpu_ext"):
        warnings.simplefilter("always")
        activation.activate()
        modules = [importlib.import_module(p.TARGET) for p in fake_transformers_patches.values()]
    ours = [str(w.message) for w in caught if issubclass(w.category, ext.TransformersTPUExtWarning)]
    assert len(ours) == 1 and "'fake_1' skipped" in ours[0], ours
    assert "transformers 5.31.0 is installed" in ours[0] and "tested with transformers 5.23.0, 5.24.0" in ours[0]
    assert activation.status() == {"fake_0": "applied", "fake_1": "skipped", "fake_2": "applied"}
    assert modules[0].f() == 2 and modules[1].f() == 1
    notes = [r.getMessage() for r in caplog.records if "5.31.0" in r.getMessage() and r.levelno == logging.INFO]
    assert len(notes) == 1, notes  # one note per library, not per patch


def test_status_tells_armed_applied_disabled_and_inactive(fake_transformers_patches, monkeypatch):
    import importlib

    monkeypatch.setenv("TRANSFORMERS_TPU_EXT_DISABLE", "fake_2")
    assert set(activation.status().values()) == {"inactive"}
    activation.activate()
    assert activation.status() == {"fake_0": "armed", "fake_1": "armed", "fake_2": "disabled"}
    assert activation.active_patches() == []  # what the README used to offer as the check
    importlib.import_module(fake_transformers_patches["fake_0"].TARGET)
    assert activation.status()["fake_0"] == "applied"


# --------------------------------------------------------------------------------------------------
# Logging follows Transformers' verbosity


@pytest.fixture
def transformers_logging():
    from transformers.utils import logging as hf_logging

    before = hf_logging.get_verbosity()
    yield hf_logging
    hf_logging.set_verbosity(before)


def test_the_plugins_logger_follows_transformers_verbosity(transformers_logging, monkeypatch):
    monkeypatch.delenv(log.VERBOSITY_ENV, raising=False)
    child = logging.getLogger("transformers_tpu_ext.someone_elses_module")  # created the usual way
    transformers_logging.set_verbosity_info()
    assert log.logger.isEnabledFor(logging.INFO) and child.isEnabledFor(logging.INFO)
    transformers_logging.set_verbosity_error()
    assert not log.logger.isEnabledFor(logging.WARNING) and not child.isEnabledFor(logging.WARNING)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        log.warn("transformers-tpu-ext: silenced")
    assert caught == []


def test_the_plugins_own_verbosity_wins(transformers_logging, monkeypatch):
    transformers_logging.set_verbosity_error()
    monkeypatch.setenv(log.VERBOSITY_ENV, "info")
    logging.Logger.manager._clear_cache()
    try:
        assert log.logger.isEnabledFor(logging.INFO)
    finally:
        monkeypatch.delenv(log.VERBOSITY_ENV)
        logging.Logger.manager._clear_cache()


def test_warn_never_raises_under_an_error_filter(caplog):
    with warnings.catch_warnings(), caplog.at_level(logging.WARNING, logger="transformers_tpu_ext"):
        warnings.simplefilter("error")
        log.warn("transformers-tpu-ext: still just a message")
    assert [r.getMessage() for r in caplog.records] == ["transformers-tpu-ext: still just a message"]


# -- one naming scheme -------------------------------------------------------------------------------


def _variables_read_by_the_package() -> set[str]:
    import re
    from pathlib import Path

    root = Path(config.__file__).parent
    found = set()
    for path in root.rglob("*.py"):
        found |= set(re.findall(r"TRANSFORMERS_TPU_EXT_[A-Z][A-Z0-9_]*[A-Z0-9]", path.read_text()))
    stems = {"TRANSFORMERS_TPU_EXT_" + prefix.rstrip("_") for prefix in config.SCHEME_PREFIXES}  # "..._SERVE_*"
    return found - set(config.RENAMED) - stems - settings.TOOL_NAMES  # the scripts' own variables


def test_every_variable_follows_one_naming_scheme():
    names = _variables_read_by_the_package()
    assert {"TRANSFORMERS_TPU_EXT_GENERATE_STEPS_PER_OCTAVE", "TRANSFORMERS_TPU_EXT_TRAIN_STEPS_PER_OCTAVE",
            "TRANSFORMERS_TPU_EXT_SERVE_MAX_LEN", "TRANSFORMERS_TPU_EXT_DISABLE"} <= names
    prefix = "TRANSFORMERS_TPU_EXT_"
    odd = sorted(n for n in names if not n.removeprefix(prefix).startswith(config.SCHEME_PREFIXES)
                 and n.removeprefix(prefix) not in config.PLUGIN_WIDE)
    assert odd == [], f"name these TRANSFORMERS_TPU_EXT_<CAPABILITY>_<SETTING> (or add them to config.RENAMED): {odd}"
    assert set(config.RENAMED.values()) <= names


def test_an_old_name_is_still_read_with_one_warning_naming_the_new_one():
    old, new = "TRANSFORMERS_TPU_EXT_STEPS_PER_OCTAVE", "TRANSFORMERS_TPU_EXT_GENERATE_STEPS_PER_OCTAVE"
    assert config.RENAMED[old] == new
    assert generation_config.current({old: "2"}).steps_per_octave == 2
    (message,) = settings.problems({old: "2"})
    assert f"{old} was renamed {new}" in message and "until release 0.2" in message
    # both set: the new name wins, and the old one is called out
    assert generation_config.current({old: "2", new: "3"}).steps_per_octave == 3
    (message,) = settings.problems({old: "2", new: "3"})
    assert f"{old}='2' is ignored" in message
    # an invalid value under the old name is still caught (named by its new variable), with the rename
    problems = settings.problems({old: "0"})
    assert len(problems) == 2 and any(f"{new}='0'" in p for p in problems)


def test_the_configuration_page_lists_every_renamed_variable():
    from pathlib import Path

    text = (Path(config.__file__).parents[1] / "docs" / "configuration.md").read_text()
    section = text.split("## Renamed settings", 1)[1].split("\n## ", 1)[0]
    rows = {tuple(cell.strip().strip("`") for cell in line.strip().strip("|").split("|"))
            for line in section.splitlines() if line.startswith("| `")}
    assert rows == set(config.RENAMED.items())
