"""Long work shows progress the way Transformers does: a bar that honours its progress-bar switch, and
one info line per step at Transformers' verbosity (``warmup()``: per compiled bucket)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from transformers.utils import logging as hf_logging  # noqa: E402

import transformers_tpu_ext as ext  # noqa: E402
from transformers_tpu_ext.testing import tiny  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def verbosity():
    before, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    yield hf_logging
    hf_logging.set_verbosity(before)
    (hf_logging.enable_progress_bar if bars else hf_logging.disable_progress_bar)()


def _lines(caplog, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if text in r.getMessage()]


@pytest.mark.slow
def test_warmup_shows_a_bar_and_one_info_line_per_compiled_bucket(simulated_tpu, verbosity, caplog, capsys):
    import transformers.generation.utils  # noqa: F401

    ext.activate()
    model = tiny.tiny_model("qwen3", seed=0).to("tpu")
    verbosity.set_verbosity_info()  # Transformers' switch, not the plugin's: the plugin follows it
    verbosity.enable_progress_bar()
    plans = ext.warmup(model, max_prompt_length=16, max_new_tokens=2, max_batch_size=2)
    lines = _lines(caplog, "transformers-tpu-ext: warmup: compiled batch")
    assert len(plans) >= 2 and len(lines) == len(plans), lines
    assert all(line.endswith(" s)") for line in lines)
    assert "warmup" in capsys.readouterr().err  # the tqdm bar

    caplog.clear()
    verbosity.set_verbosity_warning()
    verbosity.disable_progress_bar()
    ext.warmup(model, max_prompt_length=16, max_new_tokens=2, max_batch_size=1)
    assert _lines(caplog, "warmup: compiled") == []
    assert "warmup" not in capsys.readouterr().err


def test_doctor_shows_its_progress(simulated_tpu, verbosity, caplog, capsys):
    from transformers_tpu_ext.cli import doctor

    verbosity.set_verbosity_info()
    verbosity.enable_progress_bar()
    assert doctor.main(["--import-targets"]) == 0  # the plain report imports nothing: no progress to show
    captured = capsys.readouterr()
    assert "Patches" in captured.out and "doctor" in captured.err
    from transformers_tpu_ext import activation, registry

    installed = [n for n in ext.status() if registry.installed(activation._patch_module(n).TARGET)]
    assert len(_lines(caplog, "transformers-tpu-ext: doctor: imported the target of")) == len(installed)


def test_the_first_use_install_says_what_it_does(tmp_path):
    # bootstrap.sh with stand-in interpreters: each step is announced (with the time so far)
    # instead of a silent minute and a half.
    fake = tmp_path / "python"
    fake.write_text(
        "#!/usr/bin/env bash\n"
        'if [ "$1 $2" = "-m venv" ]; then mkdir -p "$3/bin"; cp "$0" "$3/bin/python"; fi\n'
        'echo "$@" >> "$(dirname "$0")/calls"\n'
    )
    fake.chmod(0o755)
    venv = tmp_path / "venv"
    proc = subprocess.run(
        ["bash", str(ROOT / "scripts" / "bootstrap.sh")],
        env={**os.environ, "PYTHON": str(fake), "TRANSFORMERS_TPU_EXT_VENV": str(venv)},
        capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(venv)
    steps = [line for line in proc.stderr.splitlines() if line.startswith("bootstrap: [")]
    assert [s.split("]")[0] for s in steps] == ["bootstrap: [1/3", "bootstrap: [2/3", "bootstrap: [3/3"], proc.stderr
    assert "torch==2.13.0" in steps[1] and "transformers-tpu-ext[test,trl,embeddings]" in steps[2]
    assert "ready in" in proc.stderr
    calls = (venv / "bin" / "calls").read_text().splitlines()
    assert len(calls) == 2 and "torch==2.13.0" in calls[0] and "[test,trl,embeddings]" in calls[1]
    # Second run: nothing to install, nothing said but the venv.
    again = subprocess.run(
        ["bash", str(ROOT / "scripts" / "bootstrap.sh")],
        env={**os.environ, "PYTHON": str(fake), "TRANSFORMERS_TPU_EXT_VENV": str(venv)},
        capture_output=True, text=True, timeout=60,
    )
    assert again.returncode == 0 and again.stderr == "" and again.stdout.strip() == str(venv)
