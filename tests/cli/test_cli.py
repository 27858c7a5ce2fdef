"""The ``transformers-tpu`` command behaves like ``accelerate``/``torchrun``: usage errors are one line
naming the fix, help speaks of TPUs, mistakes are found before any work starts. Each case runs the
command in a fresh process, as a user does."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow


def _run(*args: str, env: dict[str, str] | None = None, cwd=None, timeout: float = 300) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("TRANSFORMERS_TPU_EXT_", "PET_", "TPU_"))}
    environ.setdefault("HF_HUB_OFFLINE", "1")
    environ.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "transformers_tpu_ext.cli", *args],
        env=environ, cwd=cwd, capture_output=True, text=True, timeout=timeout,
    )


def test_bare_command_is_a_usage_error_in_one_line():
    proc = _run()
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [
        "transformers-tpu: error: a command is required (choose from demo, launch, doctor, warmup, selftest; "
        "`transformers-tpu --help` says what each does)"
    ]
    help_ = _run("--help")
    assert help_.returncode == 0 and "--version" in help_.stdout and "launch" in help_.stdout
    version = _run("--version")
    assert version.returncode == 0 and version.stdout.startswith("transformers-tpu-ext ")
    unknown = _run("lanch")
    assert unknown.returncode == 2
    (line,) = unknown.stderr.strip().splitlines()
    assert line.startswith("transformers-tpu: error: unknown command 'lanch' (did you mean 'launch'? choose from demo")


def test_a_bad_setting_is_one_line_not_a_warning_and_an_error():
    # The activation warning is left to the command, which names the variable in its one line.
    proc = _run("demo", env={"TRANSFORMERS_TPU_EXT_GENERATE_PROMPT_BUCKETS": "abc"})
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("transformers-tpu demo: error: TRANSFORMERS_TPU_EXT_GENERATE_PROMPT_BUCKETS='abc'")


def test_launch_without_a_script_is_one_line():
    proc = _run("launch")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "transformers-tpu launch: error: no training script given: pass the script to run (or -m module), "
        "after the torchrun options (see --help)"
    ]


def test_launch_checks_the_script_and_the_module_before_any_worker_starts(tmp_path):
    simulate = {"TRANSFORMERS_TPU_EXT_SIMULATE": "chips=4,generation=v6e"}
    missing = _run("launch", "--nproc_per_node=4", "missing.py", env=simulate, cwd=tmp_path)
    assert missing.returncode == 2
    assert missing.stderr.strip().splitlines() == [
        f"transformers-tpu launch: error: can't open file 'missing.py': no such file (in {tmp_path}); "
        "pass the path of the training script."
    ]
    module = _run("launch", "-m", "no_such_package.train", env=simulate, cwd=tmp_path)
    assert module.returncode == 2 and "no module named 'no_such_package.train'" in module.stderr
    assert "torchrun" not in module.stderr.lower() and "Traceback" not in module.stderr
    # A module that exists is found without being imported (its code would run in the launcher).
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("raise SystemExit('imported in the launcher')\n")
    (tmp_path / "pkg" / "train.py").write_text("")
    from argparse import Namespace

    from transformers_tpu_ext.cli import launch

    launch.check_script(Namespace(training_script="pkg.train", module=True, no_python=False), cwd=str(tmp_path))


def test_launch_finds_modules_that_an_import_hook_provides(tmp_path, monkeypatch):
    # Editable installs (pip install -e) put a finder on sys.meta_path, not a directory on sys.path.
    import importlib.abc
    import importlib.machinery
    from argparse import Namespace

    from transformers_tpu_ext.cli import launch

    package = tmp_path / "hidden" / "hooked_pkg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "train.py").write_text("")

    class Editable(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "hooked_pkg":
                return importlib.machinery.PathFinder.find_spec(name, [str(tmp_path / "hidden")])
            return None

    monkeypatch.setattr(sys, "meta_path", [*sys.meta_path, Editable()])
    args = Namespace(training_script="hooked_pkg.train", module=True, no_python=False)
    launch.check_script(args, cwd=str(tmp_path))  # found, not refused
    missing = Namespace(training_script="hooked_pkg.nope", module=True, no_python=False)
    with pytest.raises(launch.LaunchError, match="no module named 'hooked_pkg.nope'"):
        launch.check_script(missing, cwd=str(tmp_path))


def test_launch_help_speaks_of_tpus():
    proc = _run("launch", "--help")
    assert proc.returncode == 0
    text = proc.stdout
    assert "[auto, cpu, gpu, xpu, int]" not in text and "(single GPU)" not in text
    assert "one per TPU chip" in text and "v5e: 1, 4, 8" in text and "TPU_WORKER_HOSTNAMES" in text
    assert text.splitlines()[0].startswith("usage: transformers-tpu launch [torchrun options] script.py")


def test_demo_with_a_model_that_does_not_exist_is_one_line_at_once():
    proc = _run("demo", "--model", "does/not-exist", timeout=120)
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("transformers-tpu demo: error: --model 'does/not-exist': not a local directory")
    # With the Hub allowed but unreachable (here: a closed local port), one line too, instead of a
    # minute of retries and a 90-line traceback.
    online = _run("demo", "--model", "does/not-exist", env={"HF_HUB_OFFLINE": "0", "HF_ENDPOINT": "http://127.0.0.1:9"}, timeout=120)
    assert online.returncode == 1
    (line,) = online.stderr.strip().splitlines()
    assert "the Hub cannot be reached" in line and "Traceback" not in online.stderr
    # A name that cannot be a Hub id: one line as well, not huggingface_hub's validation traceback.
    invalid = _run("demo", "--model", "my model", timeout=120)
    assert invalid.returncode == 2
    (line,) = invalid.stderr.strip().splitlines()
    assert line == (
        "transformers-tpu demo: error: --model 'my model': not a local directory and not a valid Hub id; "
        "pass a local model directory or a Hub id such as Qwen/Qwen3-0.6B."
    )


def test_demo_follows_the_simulate_setting_and_says_its_weights_are_random():
    proc = _run(
        "demo", "--max-new-tokens", "3",
        env={"TRANSFORMERS_TPU_EXT_SIMULATE": "chips=8,generation=v5e,hbm=1GiB"},
    )
    assert proc.returncode == 0, proc.stderr
    assert "chip:            TPU v5e x8, 1 GiB HBM each" in proc.stdout
    assert "tiny local model with random weights" in proc.stdout
