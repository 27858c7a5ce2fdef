"""Setting torch_tpu's compile cache up at activation (``compilation.persistent``), in this process.

The facts the plugin gathers (a TPU on the PCI bus, a writable directory, the backend having
compiled already) and what ``setup()`` / ``restore()`` do to the environment. Across processes:
``test_cache_processes.py``.
"""

from __future__ import annotations

import os

import pytest

from transformers_tpu_ext.compilation import cache, persistent


def _device(root, name, vendor, klass):
    path = root / name
    path.mkdir()
    (path / "vendor").write_text(vendor + "\n")
    (path / "class").write_text(klass + "\n")


def test_a_tpu_is_a_google_processing_accelerator_on_the_pci_bus(tmp_path):
    _device(tmp_path, "0000:00:04.0", "0x1ae0", "0x020000")  # Google's gVNIC network card: not a TPU
    _device(tmp_path, "0000:00:05.0", "0x8086", "0x120000")  # someone else's accelerator
    assert not persistent.tpu_on_host(str(tmp_path))
    _device(tmp_path, "0000:00:06.0", "0x1ae0", "0x120000")
    assert persistent.tpu_on_host(str(tmp_path))
    assert not persistent.tpu_on_host(str(tmp_path / "missing"))


def test_writable_means_a_directory_that_exists_or_can_be_created(tmp_path):
    assert persistent.writable(str(tmp_path))
    assert persistent.writable(str(tmp_path / "a" / "b" / "c"))
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert not persistent.writable(str(blocker))  # a file, not a directory
    assert not persistent.writable(str(blocker / "cache"))  # cannot be created under a file


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere: permission bits do not stop it")
def test_a_read_only_directory_is_not_writable(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    home.chmod(0o500)
    try:
        assert not persistent.writable(str(home / ".cache" / "huggingface"))
    finally:
        home.chmod(0o700)


@pytest.fixture
def tpu_host(monkeypatch, tmp_path):
    """This process seen as a TPU VM with torch_tpu 0.2.0 installed, its Hugging Face cache in tmp_path."""
    monkeypatch.setattr(persistent, "tpu_on_host", lambda: True)
    monkeypatch.setattr(persistent, "torch_tpu_version", lambda: "0.2.0")
    monkeypatch.setattr(persistent, "compiled_already", lambda: False)
    environ = {"HF_HOME": str(tmp_path / "hf")}
    yield environ
    persistent.restore(environ)


def test_on_a_tpu_vm_setup_sets_the_root_once_and_restore_removes_it(tpu_host, tmp_path, caplog):
    with caplog.at_level("INFO", logger="transformers_tpu_ext"):
        plan = persistent.setup(tpu_host)
    root = str(tmp_path / "hf" / "transformers-tpu-ext" / "compile-cache" / "torch_tpu-0.2.0")
    assert plan.action == "set" and tpu_host[cache.ROOT_ENV] == root
    assert [r.getMessage() for r in caplog.records if root in r.getMessage()] == [
        f"transformers-tpu-ext: compiled programs are kept in {root} (TRANSFORMERS_TPU_EXT_COMPILE_CACHE=off turns this off)"
    ]
    assert not os.path.exists(root)  # torch_tpu creates it at its first compilation, not the plugin
    report = persistent.report(tpu_host)
    assert (report["root"], report["set_by"], report["entries"], report["writable"]) == (root, "transformers-tpu-ext", 0, True)
    persistent.restore(tpu_host)
    assert cache.ROOT_ENV not in tpu_host


def test_variables_the_user_set_are_left_alone(tpu_host):
    tpu_host[cache.ROOT_ENV] = "/my/cache"
    tpu_host["TORCH_TPU_TIER2_COMPILATION_CACHE"] = "disabled"
    before = dict(tpu_host)
    plan = persistent.setup(tpu_host)
    assert plan.action == "leave" and tpu_host == before
    persistent.restore(tpu_host)
    assert tpu_host == before  # restore() only removes what setup() set
    assert persistent.report(tpu_host)["set_by"] == "environment"


def test_a_read_only_home_leaves_the_cache_off_with_the_reason(tpu_host, tmp_path):
    (tmp_path / "hf").write_text("not a directory")  # HF_HOME cannot hold the cache
    plan = persistent.setup(tpu_host)
    assert (plan.action, plan.case) == ("off", "read_only")
    assert cache.ROOT_ENV not in tpu_host


def test_an_explicit_directory_that_cannot_be_written_is_a_warning(tpu_host, tmp_path):
    from transformers_tpu_ext import TransformersTPUExtWarning

    (tmp_path / "f").write_text("x")
    tpu_host[cache.CACHE_ENV] = str(tmp_path / "f" / "cache")
    with pytest.warns(TransformersTPUExtWarning, match="persistent compile cache is off.*cannot be created or written"):
        plan = persistent.setup(tpu_host)
    assert plan.case == "read_only" and cache.ROOT_ENV not in tpu_host


def test_without_a_chip_setup_changes_nothing(monkeypatch, tmp_path):
    monkeypatch.setattr(persistent, "tpu_on_host", lambda: False)
    environ = {"HF_HOME": str(tmp_path)}
    plan = persistent.setup(environ)
    assert (plan.action, plan.case) == ("off", "no_tpu") and environ == {"HF_HOME": str(tmp_path)}


def test_after_the_backend_compiled_the_plugin_is_too_late_and_says_so(simulated_tpu, monkeypatch, tmp_path):
    import torch

    from transformers_tpu_ext import TransformersTPUExtWarning

    torch.ones(3, device="tpu").add_(1)  # looks up (and compiles) a program: the backend read its variables
    assert persistent.compiled_already()
    stats = persistent.process_stats()
    assert stats and stats["requests"] == stats["hits"] + stats["misses"] and stats["misses"] >= 1
    monkeypatch.setattr(persistent, "tpu_on_host", lambda: True)
    monkeypatch.setattr(persistent, "torch_tpu_version", lambda: "0.2.0")
    environ = {"HF_HOME": str(tmp_path)}
    plan = persistent.setup(environ)
    assert (plan.action, plan.case) == ("off", "late") and cache.ROOT_ENV not in environ
    environ[cache.CACHE_ENV] = str(tmp_path / "asked")
    with pytest.warns(TransformersTPUExtWarning, match="before the first TPU operation"):
        assert persistent.setup(environ).case == "late"
    assert cache.ROOT_ENV not in environ
