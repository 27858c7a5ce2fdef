"""Every example of README.md, docs/ and benchmarks/README.md runs, as written.

One test per page. Each runs ``python -m pytest -p sybil_pages PAGE`` (``sybil_pages.py`` says what runs
and how) in a fresh process, because a page changes process-wide state as a reader's session would
(``deactivate()``, ``configure()``, a simulated host of its own), in an environment like a reader's on
a machine without a TPU:

- ``TRANSFORMERS_TPU_EXT_SIMULATE=1``: the simulated TPU (4 x v6e) in the page's process and in every
  process a shell block starts (``transformers-tpu launch`` workers, ``transformers serve``);
- ``HF_HUB_CACHE`` is a cache of its own where each Hub model a page names (:data:`HUB_STAND_INS`) is a
  tiny local model under that name (``testing.tiny.save_hub_stand_in``), and ``HF_HUB_OFFLINE=1``:
  ``from_pretrained("Qwen/Qwen3-0.6B")`` loads the stand-in, nothing is downloaded;
- a fresh working directory per page, where the page's files (``generate.py``, ``out/``) go, with the
  clone's ``scripts/`` and ``benchmarks/`` linked in (the README's commands run "from a clone").

A page with a multi-process example (``transformers-tpu launch``, ``torchrun``, ``accelerate launch``)
is marked slow.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md"), ROOT / "benchmarks" / "README.md"])

#: The Hub models the pages name, and the tiny architecture that stands in for each (testing.tiny).
HUB_STAND_INS = {
    "Qwen/Qwen3-0.6B": "qwen3",
    "Qwen/Qwen3-8B": "qwen3",
    "zai-org/GLM-4-9B-0414": "glm4",
}
#: Seconds one page may take.
PAGE_TIMEOUT = 2400

_MULTI_PROCESS = re.compile(r"transformers-tpu launch|torchrun|accelerate launch|launch\.main\(")
_BLOCK = re.compile(r"(<!-- skip: next[^>]*-->\s*)?```(bash|python|console)\n(.*?)```", re.S)


def _multi_process(page: Path) -> bool:
    return any(not skip and _MULTI_PROCESS.search(body) for skip, _, body in _BLOCK.findall(page.read_text()))


def _param(page: Path) -> object:
    marks = [pytest.mark.slow] if _multi_process(page) else []
    return pytest.param(page, id=str(page.relative_to(ROOT)), marks=marks)


@pytest.fixture(scope="session")
def hub_cache(tmp_path_factory) -> Path:
    from transformers_tpu_ext.testing.tiny import save_hub_stand_in

    cache = tmp_path_factory.mktemp("hub")
    for repo_id, arch in HUB_STAND_INS.items():
        save_hub_stand_in(repo_id, cache, arch=arch)
    return cache


def page_environment(hub_cache: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRANSFORMERS_TPU_EXT_", "PET_", "TORCH_TPU_"))}
    bin_dir = str(Path(sys.executable).parent)
    env.update(
        TRANSFORMERS_TPU_EXT_SIMULATE="1",
        TRANSFORMERS_TPU_EXT_VENV=sys.prefix,  # scripts/*.sh use the venv running this test
        HF_HUB_CACHE=str(hub_cache),
        HF_HUB_OFFLINE="1",
        HF_HUB_DISABLE_PROGRESS_BARS="1",
        TOKENIZERS_PARALLELISM="false",
        OMP_NUM_THREADS="1",
        PATH=bin_dir + os.pathsep + env.get("PATH", ""),
        PYTHONPATH=os.pathsep.join(filter(None, [str(HERE), env.get("PYTHONPATH")])),
    )
    env.pop("TORCH_DEVICE_BACKEND_AUTOLOAD", None)
    return env


@pytest.mark.parametrize("page", [_param(p) for p in PAGES])
def test_every_example_of_the_page_runs(page: Path, hub_cache: Path, tmp_path: Path) -> None:
    for name in ("scripts", "benchmarks"):
        (tmp_path / name).symlink_to(ROOT / name)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "sybil_pages", "-p", "no:cacheprovider", "-q", "-rs",
         "--rootdir", str(ROOT), "-c", str(HERE / "pages.ini"), str(page)],
        cwd=tmp_path, env=page_environment(hub_cache), capture_output=True, text=True, timeout=PAGE_TIMEOUT,
    )
    report = proc.stdout[-20000:] + proc.stderr[-5000:]
    assert proc.returncode == 0, f"{page.relative_to(ROOT)}: an example failed\n{report}"
    assert re.search(r"\d+ passed", proc.stdout), report
