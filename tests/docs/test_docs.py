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

The pages' processes run two at a time (``DOCS_PAGES_AT_ONCE``, default: the machine's cores, at most 2),
started ahead in the order of the selected tests while this process waits on one, and never two pages
with multi-process examples at once (their launchers would share the chips' ports).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
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
    # Every page runs its examples in fresh interpreters (the longest, the multi-process pages, first):
    # the everyday loop (-m "not slow") leaves them to the whole suite.
    return pytest.param(page, id=str(page.relative_to(ROOT)), marks=[pytest.mark.slow])


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


class _Pages:
    """Runs the selected pages' processes ahead, at most ``at_once`` together (one multi-process page)."""

    def __init__(self, pages: list[Path], hub_cache: Path, base: Path, at_once: int) -> None:
        self.queue = list(dict.fromkeys(pages))
        self.hub_cache, self.base, self.at_once = hub_cache, base, max(1, at_once)
        self.running: dict[Path, tuple[subprocess.Popen, float, Path]] = {}
        self.done: dict[Path, tuple[int | None, str]] = {}

    def _start(self, page: Path) -> None:
        cwd = self.base / re.sub(r"[^A-Za-z0-9]+", "_", str(page.relative_to(ROOT)))
        cwd.mkdir(parents=True)
        for name in ("scripts", "benchmarks"):
            (cwd / name).symlink_to(ROOT / name)
        out = cwd.parent / (cwd.name + ".out")
        with open(out, "w") as sink:
            proc = subprocess.Popen(
                [sys.executable, "-m", "pytest", "-p", "sybil_pages", "-p", "no:cacheprovider", "-q", "-rs",
                 "--rootdir", str(ROOT), "-c", str(HERE / "pages.ini"), str(page)],
                cwd=cwd, env=page_environment(self.hub_cache), stdout=sink, stderr=subprocess.STDOUT,
                text=True, start_new_session=True,
            )
        self.running[page] = (proc, time.monotonic(), out)

    def _reap(self) -> None:
        for page, (proc, started, out) in list(self.running.items()):
            if proc.poll() is None and time.monotonic() - started > PAGE_TIMEOUT:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                self.done[page] = (None, out.read_text()[-25000:])
            elif proc.poll() is not None:
                self.done[page] = (proc.returncode, out.read_text()[-25000:])
            else:
                continue
            del self.running[page]

    def _fill(self, needed: Path) -> None:
        for page in list(self.queue):
            if len(self.running) >= self.at_once:
                return
            if _multi_process(page) and any(_multi_process(p) for p in self.running):
                if page == needed:
                    return
                continue
            self.queue.remove(page)
            self._start(page)

    def result(self, page: Path) -> tuple[int | None, str]:
        """The page's (return code, output): None as the code when it ran out of time."""
        if page not in self.queue and page not in self.running and page not in self.done:
            self.queue.insert(0, page)
        while page not in self.done:
            self._reap()
            self._fill(page)
            time.sleep(0.2)
        return self.done.pop(page)

    def close(self) -> None:
        for proc, _, _ in self.running.values():
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.fixture(scope="session")
def pages(request, hub_cache: Path, tmp_path_factory) -> object:
    selected = [item.callspec.params["page"] for item in request.session.items
                if item.originalname == "test_every_example_of_the_page_runs"]
    at_once = int(os.environ.get("DOCS_PAGES_AT_ONCE", min(2, os.cpu_count() or 1)))
    runner = _Pages(selected, hub_cache, tmp_path_factory.mktemp("pages"), at_once)
    yield runner
    runner.close()


@pytest.mark.parametrize("page", [_param(p) for p in PAGES])
def test_every_example_of_the_page_runs(page: Path, pages: _Pages) -> None:
    returncode, report = pages.result(page)
    assert returncode is not None, f"{page.relative_to(ROOT)}: did not finish in {PAGE_TIMEOUT} s\n{report}"
    assert returncode == 0, f"{page.relative_to(ROOT)}: an example failed\n{report}"
    assert re.search(r"\d+ passed", report), report
