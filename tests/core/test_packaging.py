"""The wheel stands on its own: license, metadata, a package page that works, entry points that work.

Builds the wheel once (from a copy of the source tree, without build isolation: no download), reads
its metadata, then installs it from a requirements file into a directory of its own and runs it
there (torch and Transformers come from the test venv).
"""

from __future__ import annotations

import email
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
_SKIP = shutil.ignore_patterns(".git", ".venv*", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    source = tmp_path_factory.mktemp("source") / "transformers-tpu-ext"
    shutil.copytree(ROOT, source, ignore=_SKIP)
    out = tmp_path_factory.mktemp("wheel")
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(source)],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    (path,) = out.glob("transformers_tpu_ext-*.whl")
    return path


@pytest.fixture(scope="module")
def metadata(wheel: Path) -> email.message.Message:
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        return email.message_from_string(archive.read(name).decode())


def test_the_wheel_carries_the_license(wheel):
    with zipfile.ZipFile(wheel) as archive:
        (license_file,) = [n for n in archive.namelist() if n.endswith("dist-info/licenses/LICENSE")]
        text = archive.read(license_file).decode()
    assert "Apache License" in text and "Version 2.0" in text
    assert text == (ROOT / "LICENSE").read_text()


def test_metadata_has_urls_classifiers_and_the_python_torch_tpu_needs(metadata):
    assert metadata["License-Expression"] == "Apache-2.0"
    urls = dict(value.split(", ", 1) for value in metadata.get_all("Project-URL"))
    assert {"Homepage", "Documentation", "Source", "Issues", "Changelog"} <= set(urls)
    classifiers = metadata.get_all("Classifier")
    assert any(c.startswith("Development Status ::") for c in classifiers)
    assert "Programming Language :: Python :: 3.11" in classifiers
    # torch-tpu 0.2.0 (the `tpu` extra) and Transformers 5 need Python 3.11: so does the package.
    assert metadata["Requires-Python"] == ">=3.11"


def test_requirements_are_the_declared_ranges(metadata):
    declared = {
        Requirement(line).name: Requirement(line).specifier
        for line in (ROOT / "transformers_tpu_ext" / "requirements.txt").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    required = {Requirement(r).name: Requirement(r).specifier for r in metadata.get_all("Requires-Dist") if "extra ==" not in r}
    assert required == declared


def test_the_package_page_works_on_its_own(metadata):
    description = metadata.get_payload()
    source = dict(value.split(", ", 1) for value in metadata.get_all("Project-URL"))["Source"]
    links = re.findall(r"\]\(([^)\s]+)\)", description)
    assert links
    relative = [link for link in links if not link.startswith(("http://", "https://", "#"))]
    assert relative == [], f"links a pip user cannot follow: {relative}"
    assert any(link.startswith(source + "/blob/main/docs/") for link in links)
    # A pip user is told what the wheel offers; the repository's scripts only "from a clone".
    assert "transformers-tpu demo" in description and "pip install" in description
    clone = description.index("From a clone")
    assert "bash scripts/" not in description[:clone]


def test_installed_from_a_requirements_file_its_entry_points_work(wheel, tmp_path):
    target = tmp_path / "site"
    requirements = tmp_path / "requirements.txt"
    requirements.write_text(f"{wheel}\n")
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), "-r", str(requirements)],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRANSFORMERS_TPU_EXT_")}
    env.update(PYTHONPATH=str(target), HF_HUB_OFFLINE="1")
    script = (
        "import json, sys, torch\n"
        "import transformers_tpu_ext as ext, _transformers_tpu_ext_autoload as entry\n"
        "from importlib import metadata\n"
        "report = {'activated_by_import_torch': ext.is_active(), 'package': ext.__file__, 'entry': entry.__file__,\n"
        "          'status': sorted({s for n, s in ext.status().items()\n"
        "                            if not ext.activation._patch_module(n).TARGET.startswith('torch.')}),\n"
        "          'license': any(str(f).endswith('LICENSE') for f in metadata.files('transformers-tpu-ext'))}\n"
        "print(json.dumps(report))\n"
    )
    run = subprocess.run([sys.executable, "-c", script], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    import json

    report = json.loads(run.stdout.strip().splitlines()[-1])
    assert report["package"].startswith(str(target)) and report["entry"].startswith(str(target))
    assert report["activated_by_import_torch"] and report["status"] == ["armed"]
    assert report["license"]
    cli = subprocess.run(
        [sys.executable, str(target / "bin" / "transformers-tpu"), "--version"],
        env=env, capture_output=True, text=True, timeout=120,
    )
    assert cli.returncode == 0 and cli.stdout.startswith("transformers-tpu-ext "), cli.stderr
