"""``transformers-tpu doctor``: versions, the TPU seen, patch state and known problems."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from transformers_tpu_ext.cli import doctor


def _line(text: str, label: str, **default: str) -> str:
    return next((line for line in text.splitlines() if line.strip().startswith(label)), *default.values())


def _doctor(capsys, *argv: str) -> str:
    assert doctor.main(list(argv)) == 0
    return capsys.readouterr().out


@pytest.fixture
def v6e(simulated_tpu, monkeypatch):
    monkeypatch.delenv("TRANSFORMERS_TPU_EXT_DISABLE", raising=False)
    simulated_tpu.configure(chips=4, generation="v6e")
    return simulated_tpu


def test_text_report_on_the_simulated_tpu(v6e, capsys):
    out = _doctor(capsys)
    assert "TPU v6e" in out and "(simulated TPU, not a chip)" in out
    assert "chips         4" in out
    assert "32.0 GiB" in out
    assert "process counts per host: 1, 4, 8" in out
    # applied if this process imported Transformers' module already, else armed: never skipped
    assert "hub_kernels" in _line(out, "active") + _line(out, "armed", default="")
    for dist in ("torch", "torch_tpu", "libtpu", "transformers", "accelerate", "wrapt", "jax", "kernels"):
        assert f"\n  {dist} " in out


def test_json_report_on_the_simulated_tpu(v6e, capsys):
    v6e.configure(chips=8, generation="v7", hbm_bytes="192GiB")
    report = json.loads(_doctor(capsys, "--json"))
    tpu = report["tpu"]
    assert (tpu["available"], tpu["generation"], tpu["chips"]) == (True, "v7", 8)
    assert tpu["hbm_bytes"] == 192 * 2**30
    assert tpu["process_counts"] == [2, 4, 8]
    assert tpu["simulated"] is True
    patches = report["patches"]
    assert "hub_kernels" in patches["active"] or patches["armed"]["hub_kernels"] == "transformers.integrations.hub_kernels"
    assert report["versions"]["transformers"]["installed"] and report["versions"]["transformers"]["ok"] is True
    assert report["versions"]["torch_tpu"]["supported"]  # from the package's `tpu` extra


def test_json_report_without_a_tpu(v6e, capsys):
    with v6e.hidden():
        report = json.loads(_doctor(capsys, "--json"))
    assert report["tpu"]["available"] is False
    assert "chips" not in report["tpu"]


@pytest.mark.slow
def test_text_report_without_a_tpu_from_the_command_line_with_a_disabled_patch(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRANSFORMERS_TPU_EXT_")}
    env["TRANSFORMERS_TPU_EXT_DISABLE"] = "hub_kernels"
    proc = subprocess.run(
        [sys.executable, "-m", "transformers_tpu_ext.cli", "doctor"],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "none seen" in proc.stdout and "the plugin changes nothing" in proc.stdout
    assert "hub_kernels" not in _line(proc.stdout, "active")
    assert "hub_kernels: disabled by TRANSFORMERS_TPU_EXT_DISABLE" in _line(proc.stdout, "hub_kernels:")
    assert "Known problems" in proc.stdout
    assert "Traceback" not in proc.stderr


# ---- known problems (pure) ----------------------------------------------------------------


def _report(**versions: str | None) -> dict:
    entries = {
        dist: {"installed": versions.get(dist), "supported": None, "ok": None} for dist in doctor.DISTRIBUTIONS
    }
    return {"versions": entries, "tpu": {"available": True, "process_counts": [1, 4, 8]}, "environment": {}}


def test_kernels_without_jax_on_tpu_is_no_problem():
    # Transformers 5.25 requires kernels; its default Hub kernels stay off on TPU, and only a request needs jax.
    assert doctor.known_problems(_report(kernels="0.19.1")) == []
    assert doctor.known_problems(_report(kernels="0.19.1", jax="0.10.2")) == []


def test_a_patch_that_stood_aside_is_a_known_problem():
    report = _report()
    reason = "stands aside: transformers 5.30.0 changed what it relies on (PreTrainedModel.train no longer exists)"
    report["patches"] = {"skipped": {"use_kernels": reason, "generation": "disabled by TRANSFORMERS_TPU_EXT_DISABLE"}}
    (problem,) = doctor.known_problems(report)
    assert "'use_kernels'" in problem and "5.30.0" in problem and "constraints.txt" in problem


def test_old_kernels_has_no_tpu_support():
    problems = doctor.known_problems(_report(kernels="0.16.0", jax="0.7.0"))
    assert any("0.17" in p for p in problems)


def test_unsupported_transformers_is_a_problem():
    report = _report()
    report["versions"]["transformers"] = {"installed": "5.30.0", "supported": ">=5.24,<5.25", "ok": False}
    (problem,) = doctor.known_problems(report)
    assert "transformers 5.30.0" in problem and ">=5.24,<5.25" in problem


def test_torch_tpu_without_a_chip_and_autoload_disabled():
    report = _report(torch_tpu="0.2.0", libtpu="0.0.50")
    report["tpu"] = {"available": False, "accelerator": None}
    report["environment"] = {"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
    problems = doctor.known_problems(report)
    assert any("no TPU is seen" in p for p in problems)
    assert any("TORCH_DEVICE_BACKEND_AUTOLOAD=0" in p for p in problems)


def test_tpu_visible_devices_does_not_restrict_chips():
    report = _report()
    report["environment"] = {"TPU_VISIBLE_DEVICES": "0,1"}
    assert any("TPU_VISIBLE_DEVICES" in p for p in doctor.known_problems(report))


def test_simulated_hbm_capped_to_the_host_is_explained(v6e, capsys, monkeypatch):
    from transformers_tpu_ext.testing import host

    monkeypatch.setattr(host, "memory_bytes", lambda: 16 * 2**30)  # 16 GiB / 2 / 4 chips = 2 GiB each
    out = _doctor(capsys)
    assert "HBM per chip  2.0 GiB (2147483648 bytes)" in out
    assert "a TPU v6e has 32.0 GiB: the simulated chips keep to half of this host's memory" in out
    v6e.configure(hbm_bytes="32GiB")
    out = _doctor(capsys)
    assert "HBM per chip  32.0 GiB" in out and "keep to half" not in out


# -- the compile cache -----------------------------------------------------------------------------


def test_the_compile_cache_section_shows_the_directory_its_entries_and_this_process(v6e, capsys, tmp_path, monkeypatch):
    import torch

    root = tmp_path / "compile-cache" / "torch_tpu-0.2.0"
    (root / "0123456789abcdef").mkdir(parents=True)
    for name in ("a", "b", "c"):
        (root / "0123456789abcdef" / f"{name}.bin").write_bytes(b"x" * 1000)
    torch.ones(3, device="tpu").mul_(2)  # this process looks up a program (the backend reads its root now)
    assert v6e.compile_cache.root() != str(root)
    monkeypatch.setenv("TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT", str(root))  # what doctor reads
    out = _doctor(capsys)
    section = out.split("\nCompile cache\n", 1)[1].split("\n\n", 1)[0]
    assert _line(section, "directory") == f"  directory     {root}  (from the environment)"
    assert _line(section, "entries") == "  entries       3 (2.9 KiB)"
    requests, hits, misses = (int(w) for w in _line(section, "this process").split()[2:7:2])
    assert misses >= 1 and requests == hits + misses
    assert _line(section, "recompiles") == "  recompiles    warn (TRANSFORMERS_TPU_EXT_COMPILE_ON_RECOMPILE)"
    report = json.loads(_doctor(capsys, "--json"))["compile_cache"]
    assert (report["root"], report["entries"], report["bytes"], report["writable"]) == (str(root), 3, 3000, True)


def test_the_compile_cache_off_says_why(v6e, capsys, monkeypatch):
    monkeypatch.delenv("TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT", raising=False)
    out = _doctor(capsys)
    assert "\nCompile cache\n  off           no TPU chip on this host" in out


def test_compile_cache_problems_an_unwritable_root_and_entries_of_other_releases():
    report = _report()
    report["compile_cache"] = {
        "root": "/ro/cache/torch_tpu-0.2.0", "writable": False,
        "other_releases": {"torch_tpu-0.1.1": {"path": "/ro/cache/torch_tpu-0.1.1", "entries": 12, "bytes": 3 * 2**20},
                           "torch_tpu-0.1.0": {"path": "/ro/cache/torch_tpu-0.1.0", "entries": 0, "bytes": 0}},
    }
    problems = doctor.known_problems(report)
    assert any("/ro/cache/torch_tpu-0.2.0 cannot be created or written: torch_tpu aborts" in p for p in problems)
    (stale,) = [p for p in problems if "other releases" in p]
    assert "/ro/cache/torch_tpu-0.1.1 (12 entries, 3.0 MiB)" in stale and "0.1.0" not in stale


def test_a_patch_whose_library_is_not_installed_waits_and_is_no_problem(v6e, capsys, monkeypatch):
    from transformers_tpu_ext import registry

    import sys

    import transformers_tpu_ext as ext

    real = registry.installed
    monkeypatch.setattr(registry, "installed", lambda target: not target.startswith("lm_eval") and real(target))
    # lm-eval imported (and patched) by an earlier test of this worker (the newest stage installs it): hidden
    # for this test, then given back with its patch.
    hidden = {name: sys.modules.pop(name) for name in list(sys.modules) if name.split(".")[0] == "lm_eval"}
    if hidden:
        ext.deactivate()
        ext.activate()
    try:
        _check_lm_eval_waits(capsys)
    finally:
        if hidden:
            sys.modules.update(hidden)
            ext.deactivate()
            ext.activate()


def _check_lm_eval_waits(capsys):
    out = _doctor(capsys)
    waiting = _line(out, "waiting")  # with the other optional libraries absent too (the matrix's venvs)
    assert "lm_eval_hf (lm_eval)" in waiting and waiting.endswith("the library is not installed; the patch applies once it is")
    assert "lm_eval_hf" not in _line(out, "active") and "skipped       none" in out
    report = json.loads(_doctor(capsys, "--json"))
    assert report["patches"]["library_not_installed"]["lm_eval_hf"] == "lm_eval"
    assert "lm_eval_hf" not in report["patches"]["skipped"] and "lm_eval_hf" not in report["patches"]["pending"]


# -- what the report imports (issue 36: seconds, not a minute; no library noise) ---------------------------

FRESH = """
import json, sys
from transformers_tpu_ext.cli import doctor
assert doctor.main([]) == 0
assert doctor.main(["--json"]) == 0
heavy = ("transformers.modeling_utils", "transformers.trainer", "accelerate.accelerator", "torchao", "trl",
         "sentence_transformers", "datasets")
print("@@" + json.dumps([name for name in heavy if name in sys.modules]))
"""


def _fresh(code: str, *argv: str, **env: str) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("TRANSFORMERS_TPU_EXT_")}
    environ.update(TRANSFORMERS_TPU_EXT_SIMULATE="chips=4,generation=v6e", HF_HUB_OFFLINE="1", **env)
    return subprocess.run([sys.executable, "-c", code, *argv], env=environ, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_the_report_imports_no_patch_target_and_says_each_patch_is_armed():
    proc = _fresh(FRESH)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out, _, imported = proc.stdout.rpartition("@@")
    assert json.loads(imported) == []  # neither Transformers' modules nor the optional libraries
    text, _, report = out.partition("\n{")
    armed = _line(text, "armed")
    assert "hub_kernels" in armed and "generation" in armed and "accelerate_memory" in armed
    assert armed.endswith("(--import-targets imports them now and runs each patch's checks)")
    assert _line(text, "active") == "  active        torch_ddp, torch_optimizer"  # torch's own modules are imported
    patches = json.loads("{" + report)["patches"]
    assert patches["armed"]["hub_kernels"] == "transformers.integrations.hub_kernels"
    assert patches["imported_targets"] is False and patches["skipped"] == {}
    assert proc.stderr.strip() == "", proc.stderr[-3000:]  # no progress bar, no library noise


@pytest.mark.slow
def test_importing_the_targets_and_the_fit_report_drop_the_library_noise(tmp_path):
    from transformers_tpu_ext.testing.tiny import save_tiny_model

    path = str(save_tiny_model(tmp_path / "tiny"))
    code = "import sys; from transformers_tpu_ext import cli; sys.exit(cli.main(sys.argv[1:]))"
    for argv in (["doctor", "--import-targets"], ["doctor", "--fit", path, "--chips", "1"]):
        proc = _fresh(code, *argv)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "Failed to load" not in proc.stderr and "register_constant()" not in proc.stderr, proc.stderr[-3000:]
    assert "hub_kernels" in _line(_fresh(code, "doctor", "--import-targets").stdout, "active")


def test_import_targets_applies_every_patch_whose_library_is_installed(v6e, capsys):
    report = json.loads(_doctor(capsys, "--json", "--import-targets"))
    patches = report["patches"]
    assert patches["imported_targets"] is True and patches["armed"] == {}
    assert {"hub_kernels", "generation", "accelerate_memory", "transformers_trainer"} <= set(patches["active"])


def test_an_armed_patch_whose_version_fails_the_gate_is_reported_skipped_without_importing(v6e, capsys, monkeypatch):
    import transformers_tpu_ext as plugin
    from transformers_tpu_ext import registry
    from transformers_tpu_ext.core import versions

    reason = "transformers 9.0.0 is installed; this release supports transformers>=5.23,<6 (tested ...)"
    monkeypatch.setattr(plugin, "status", lambda: {name: "armed" for name in registry.REGISTRY})
    monkeypatch.setattr(plugin, "active_patches", lambda: [])
    monkeypatch.setattr(plugin, "skipped_patches", lambda: {})
    monkeypatch.setattr(versions, "version_gate", lambda dist: reason if dist == "transformers" else None)
    patches = json.loads(_doctor(capsys, "--json"))["patches"]
    assert patches["skipped"]["generation"] == reason and patches["skipped"]["hub_kernels"] == reason
    assert "accelerate_memory" not in patches["skipped"]  # accelerate passes its gate
    out = _doctor(capsys)
    assert f"    generation: {reason}" in out


def test_past_the_tested_releases_doctor_imports_those_targets_so_their_checks_run(monkeypatch):
    from transformers_tpu_ext.core import versions

    imported: list[str] = []
    monkeypatch.setattr(doctor, "_import_targets", lambda targets: imported.extend(targets.values()) or {})
    monkeypatch.setattr(versions, "untested", lambda dist: "transformers 5.30.0 is installed" if dist == "transformers" else None)
    doctor._patches()
    assert "transformers.modeling_utils" in imported and "accelerate.state" not in imported
    imported.clear()
    monkeypatch.setattr(versions, "untested", lambda dist: None)
    doctor._patches()
    assert imported == []  # on the tested releases nothing is imported: a few seconds


def test_a_patch_that_stands_aside_is_listed_under_known_problems(v6e, capsys, monkeypatch):
    import importlib

    import transformers.modeling_utils  # noqa: F401

    import transformers_tpu_ext as ext
    from transformers_tpu_ext import registry
    from transformers_tpu_ext.core.relies import Signature

    patch = importlib.import_module(registry.module_name("use_kernels"))
    monkeypatch.setattr(patch, "RELIES_ON", (Signature("PreTrainedModel.set_use_kernels", ("renamed_in_5_30",)),))
    ext.deactivate()
    ext.activate()
    try:
        out = _doctor(capsys)
    finally:
        monkeypatch.undo()
        ext.deactivate()
        ext.activate()
    problems = out.split("Known problems", 1)[1]
    assert "patch 'use_kernels' is not applied: stands aside" in problems and "renamed_in_5_30" in problems
