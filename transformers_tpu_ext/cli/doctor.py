"""``transformers-tpu doctor``: what is installed, what TPU is seen, what the plugin changed.

Prints the versions that matter (with the supported range and the tested releases where the plugin
has them), whether a TPU is seen (generation, chips, HBM, process counts ``transformers-tpu launch``
accepts), which patches are active, armed, waiting or skipped and why, the persistent compile cache
(directory, entries and size, this process's hits and misses), invalid ``TRANSFORMERS_TPU_EXT_*``
settings, and the known problems of the installed combination. Plain text by default, ``--json`` for
scripts. The exit status is 0 whenever the report could be made: problems are reported, not raised.
See ``docs/doctor.md``.

The report is built in two steps: :func:`collect` gathers facts (imports torch, and reads every
version gate from the installed versions; with ``--import-targets`` it also imports each patch's target
module, so each patch's own checks run: Transformers and the optional libraries take seconds to a
minute to import, which the plain report spares), :func:`known_problems` and :func:`format_text` are
plain functions over that dict.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import warnings
from importlib import metadata
from typing import Any

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from .. import __version__
from .. import backend, config, settings
from ..core import topology, versions
from ..core.progress import Progress
from . import doctor_fit, running
from .args import Parser, parse
from .doctor_text import _size, format_text  # the report as text, re-exported here
from ..testing.chips import SIMULATE_ENV
from ..kernels.patch_hub_kernels import INSTALL as KERNELS_INSTALL
from ..kernels.patch_hub_kernels import KERNELS_TPU_MIN

__all__ = ["DISTRIBUTIONS", "collect", "format_text", "known_problems", "main"]

#: Distributions the report lists, in order.
DISTRIBUTIONS = ("torch", "torch_tpu", "libtpu", "transformers", "accelerate", "wrapt", "jax", "kernels")
_OWN_DISTRIBUTION = "transformers-tpu-ext"
PROG = "transformers-tpu doctor"


# --------------------------------------------------------------------------------------------
# Facts
# --------------------------------------------------------------------------------------------


def _release(version: str) -> Version | None:
    try:
        return Version(Version(version).base_version)
    except InvalidVersion:
        return None


def _extras_ranges() -> dict[str, str]:
    """Ranges this package declares for optional distributions (the ``tpu`` extra: torch-tpu)."""
    ranges: dict[str, str] = {}
    try:
        requires = metadata.requires(_OWN_DISTRIBUTION) or []
    except metadata.PackageNotFoundError:
        return ranges
    for line in requires:
        try:
            req = Requirement(line)
        except Exception:  # noqa: BLE001
            continue
        if req.marker is not None and "extra" in str(req.marker) and str(req.specifier):
            ranges[req.name.lower().replace("_", "-")] = str(req.specifier)
    return ranges


def _kernels_range() -> str | None:
    """The ``kernels`` range Transformers accepts (it ignores other versions): the requirement its
    distribution declares (read without importing Transformers), else its ``import_utils`` constants."""
    try:
        for line in metadata.requires("transformers") or []:
            req = Requirement(line)
            if req.name.lower() == "kernels" and str(req.specifier):
                return str(req.specifier)
    except Exception:  # noqa: BLE001 - no metadata: ask Transformers itself
        pass
    try:
        from transformers.utils import import_utils

        return f">={import_utils.KERNELS_MIN_VERSION},<{import_utils.KERNELS_MAX_VERSION}"
    except Exception:  # noqa: BLE001
        return None


def _supported(distribution: str, extras: dict[str, str]) -> str | None:
    key = distribution.lower().replace("_", "-")
    spec = versions.SUPPORTED.get(key) or extras.get(key) or (_kernels_range() if key == "kernels" else None)
    # Lower bound first: ">=2.13,<2.14" reads better than SpecifierSet's "<2.14,>=2.13".
    return ",".join(sorted(spec.split(","), key=lambda part: not part.startswith(">"))) if spec else None


def _versions() -> dict[str, dict[str, Any]]:
    extras = _extras_ranges()
    report: dict[str, dict[str, Any]] = {}
    for dist in DISTRIBUTIONS:
        installed = versions.installed_version(dist)
        supported = _supported(dist, extras)
        ok = None
        if installed is not None and supported is not None:
            release = _release(installed)
            ok = release is not None and SpecifierSet(supported).contains(release, prereleases=True)
        tested = list(versions.tested_versions(dist)) if dist in versions.SUPPORTED else []
        untested = bool(ok and tested and versions.untested(dist))
        report[dist] = {"installed": installed, "supported": supported, "ok": ok, "tested": tested, "untested": untested}
    return report


def _simulated() -> bool:
    for module in ("transformers_tpu_ext.testing", "transformers_tpu_ext.testing.simulator"):
        probe = getattr(sys.modules.get(module), "is_installed", None)
        if callable(probe):
            try:
                return bool(probe())
            except Exception:  # noqa: BLE001
                pass
    return bool(os.environ.get(SIMULATE_ENV, "").strip() not in {"", "0"})


def _tpu() -> dict[str, Any]:
    torch = sys.modules.get("torch")
    current = None
    try:
        # check_available: a CUDA build of torch names "cuda" on a machine without a GPU.
        accelerator = torch.accelerator.current_accelerator(check_available=True) if torch is not None else None
        current = accelerator.type if accelerator is not None else None
    except Exception:  # noqa: BLE001
        pass
    facts: dict[str, Any] = {"available": False, "accelerator": current}
    try:
        info = backend.chip_info()
    except Exception as error:  # noqa: BLE001 - e.g. an unknown generation makes the backend raise
        facts["error"] = f"{type(error).__name__}: {error}"
        return facts
    if info is None:
        return facts
    generation = topology.normalize_generation(info.name) or info.generation
    counts = topology.supported_counts(generation)
    facts.update(
        available=True,
        name=info.name,
        generation=generation,
        chips=info.count,
        hbm_bytes=info.total_memory,
        process_counts=list(counts) if counts is not None else None,
        simulated=_simulated(),
    )
    nominal = _capped_simulated_hbm(info.total_memory)
    if nominal:
        facts["chip_hbm_bytes"] = nominal
    return facts


def _capped_simulated_hbm(total_memory: int) -> int | None:
    """The generation's HBM when the simulated TPU reports less by default (capped to fit this host)."""
    testing = sys.modules.get("transformers_tpu_ext.testing")
    sim = testing.simulated_tpu() if testing is not None else None
    if sim is None or sim.hbm_bytes is not None:
        return None
    from ..testing.chips import CHIPS

    chip = CHIPS.get(sim.generation)
    return chip.hbm_bytes if chip is not None and chip.hbm_bytes > total_memory else None


def _import_targets(targets: dict[str, str]) -> dict[str, str]:
    """Import each of ``targets`` (patch -> module) so its post-import hook runs here; the failures, by patch."""
    errors: dict[str, str] = {}
    with warnings.catch_warnings(), Progress(len(targets), desc="doctor", unit="patch") as progress:
        warnings.simplefilter("ignore")
        for name, target in targets.items():
            try:
                importlib.import_module(target)
            except Exception as error:  # noqa: BLE001
                errors[name] = f"target not importable ({type(error).__name__}: {error})"
            progress.step(f"imported the target of {name}")
    return errors


def _patches(import_targets: bool = False) -> dict[str, Any]:
    """Each patch's state. Without ``import_targets`` only the targets of patches whose library is installed at
    a release past the tested ones are imported (there, what a patch relies on may have changed: importing runs
    its checks, and a patch that stands aside is reported); on the tested releases nothing is imported: a patch
    whose target this process has not imported is *armed* (it applies when its module is imported) once its
    version gate passes (read from the installed versions, as the hook would), or skipped with the gate's reason."""
    import transformers_tpu_ext as plugin
    from ..registry import REGISTRY, installed, module_name

    before = plugin.status()
    patches = {name: importlib.import_module(module_name(name)) for name in REGISTRY}
    # patch -> the optional library it waits for (not installed: nothing wrong)
    absent = {name: patch.TARGET.partition(".")[0] for name, patch in patches.items() if not installed(patch.TARGET)}
    untested = {dist for dist in {p.DISTRIBUTION for p in patches.values()} if versions.untested(dist)}
    to_import = {
        name: patch.TARGET
        for name, patch in patches.items()
        if name not in absent and (import_targets or patch.DISTRIBUTION in untested)
    }
    errors = _import_targets(to_import) if to_import else {}
    status = plugin.status()
    active = plugin.active_patches()
    skipped = dict(plugin.skipped_patches())
    for name, reason in errors.items():
        skipped.setdefault(name, reason)
    armed: dict[str, str] = {}  # patch -> the module whose import applies it
    for name, patch in patches.items():
        if status[name] != "armed" or name in absent or name in skipped:
            continue
        reason = versions.version_gate(patch.DISTRIBUTION)
        if reason is not None:
            skipped[name] = reason
        elif patch.TARGET not in sys.modules:
            armed[name] = patch.TARGET
    done = set(active) | set(skipped) | set(absent) | set(armed)
    pending = [name for name in REGISTRY if name not in done]
    return {
        "plugin_active": plugin.is_active(),
        "active": active,
        "armed": armed,
        "skipped": skipped,
        "pending": pending,
        "library_not_installed": absent,
        "imported_targets": import_targets,
        "status": status,
        "status_before_imports": before,
        "disable_env": os.environ.get(config.DISABLE_ENV) or None,
    }


def _compile_cache() -> dict[str, Any]:
    """The persistent compile cache (``compilation.persistent.report``) and the recompile guard's setting."""
    from ..compilation import guard, persistent

    try:
        facts = persistent.report()
    except Exception as error:  # noqa: BLE001 - the report goes on without it
        facts = {"root": None, "error": f"{type(error).__name__}: {error}"}
    try:
        facts["on_recompile"] = guard.current().on_recompile
    except ValueError:
        facts["on_recompile"] = None  # invalid: listed under settings
    return facts


def collect(import_targets: bool = False) -> dict[str, Any]:
    """Gather the facts of this process and machine as a JSON-able dict (``import_targets``: import every
    patch's target module first, so each patch is applied or skipped here; see :func:`_patches`)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import torch  # noqa: F401 - loads torch_tpu (and the simulated TPU) through entry points

    environment = {
        key: os.environ[key]
        for key in ("TORCH_DEVICE_BACKEND_AUTOLOAD", "TPU_VISIBLE_DEVICES", "TPU_WORKER_HOSTNAMES", SIMULATE_ENV)
        if key in os.environ
    }
    report: dict[str, Any] = {
        "plugin": {"version": __version__},
        "versions": _versions(),
        "tpu": _tpu(),
        "patches": _patches(import_targets),
        "compile_cache": _compile_cache(),
        "settings": settings.problems(),
        "environment": environment,
    }
    report["problems"] = known_problems(report)
    return report


# --------------------------------------------------------------------------------------------
# Known problems (pure)
# --------------------------------------------------------------------------------------------


def _older(installed: str | None, minimum: str) -> bool:
    release = _release(installed) if installed else None
    return release is not None and release < Version(minimum)


def known_problems(report: dict[str, Any]) -> list[str]:
    """Problems of the installed combination, each with what to do. Pure: reads ``report`` only."""
    problems: list[str] = []
    dists = report.get("versions", {})
    tpu = report.get("tpu", {})
    env = report.get("environment", {})

    def installed(dist: str) -> str | None:
        return dists.get(dist, {}).get("installed")

    problems += [f"invalid setting: {problem}" for problem in report.get("settings", [])]

    for dist in ("torch", "transformers", "accelerate", "wrapt", "torch_tpu"):
        entry = dists.get(dist, {})
        if entry.get("ok") is False:
            problems.append(
                f"{dist} {entry['installed']} is outside the supported range {dist}{entry['supported']}: "
                f"the patches gated on it are skipped; install a supported {dist}."
            )
    if installed("torch_tpu") and not installed("libtpu"):
        problems.append("torch_tpu is installed without libtpu: pip install 'torch_tpu' pulls it in (libtpu>=0.0.50).")
    if installed("torch_tpu") and not tpu.get("available"):
        problems.append(
            "torch_tpu is installed but no TPU is seen (torch.accelerator has no 'tpu'): run on a Cloud TPU VM; "
            "if another process holds the chips, stop it (a second process cannot open a held chip)."
        )
    if tpu.get("error"):
        problems.append(f"the TPU backend failed to describe the chip ({tpu['error']}).")
    if env.get("TORCH_DEVICE_BACKEND_AUTOLOAD") == "0":
        problems.append(
            "TORCH_DEVICE_BACKEND_AUTOLOAD=0: torch loads neither torch_tpu nor this plugin at import; "
            "unset it, or `import torch_tpu, transformers_tpu_ext` yourself."
        )
    if tpu.get("available"):
        if tpu.get("process_counts") is None:
            problems.append(
                f"unknown TPU generation {tpu.get('generation') or tpu.get('name')!r}: `transformers-tpu launch` "
                "cannot check process counts up front (the backend still will)."
            )
        if env.get("TPU_VISIBLE_DEVICES"):
            problems.append(
                "TPU_VISIBLE_DEVICES is set but does not restrict the chips torch_tpu uses (known torch_tpu "
                "defect); choose the chips with --nproc_per_node in `transformers-tpu launch` instead."
            )
        # kernels without jax is no problem: Transformers' default Hub kernels stay off on TPU, and a request
        # names the install command (docs/doctor.md, "Hub kernels on TPU").
        kernels = installed("kernels")
        if kernels and _older(kernels, KERNELS_TPU_MIN):
            problems.append(
                f"kernels {kernels} has no TPU kernels (TPU support starts at {KERNELS_TPU_MIN}): {KERNELS_INSTALL}"
            )
    entry = dists.get("kernels", {})
    if entry.get("ok") is False:
        problems.append(
            f"kernels {entry['installed']} is outside the range Transformers accepts ({entry['supported']}): "
            f"Transformers ignores it; {KERNELS_INSTALL}"
        )
    cache = report.get("compile_cache", {})
    if cache.get("root") and cache.get("writable") is False:
        problems.append(
            f"the compile cache root {cache['root']} cannot be created or written: torch_tpu aborts at its first "
            "compilation; point TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT (or TRANSFORMERS_TPU_EXT_COMPILE_CACHE) at a "
            "writable directory."
        )
    stale = {name: entry for name, entry in (cache.get("other_releases") or {}).items() if entry.get("entries")}
    if stale:
        listed = ", ".join(f"{entry['path']} ({entry['entries']} entries, {_size(entry['bytes'])})" for entry in stale.values())
        problems.append(
            f"compile-cache entries of other releases, which this torch_tpu never reads: {listed}; delete them to "
            "free the space."
        )
    patches = report.get("patches", {})
    for name, reason in (patches.get("skipped") or {}).items():
        if not reason.startswith("disabled"):  # disabled on purpose is no problem
            problems.append(
                f"patch {name!r} is not applied: {reason}. What it does is missing until a release of the plugin "
                "supports this version; meanwhile install a tested release (pip install -c constraints.txt ...)."
            )
    if patches and not patches.get("plugin_active", True):
        problems.append("the plugin is not active (deactivate() was called): Transformers runs unpatched.")
    return problems


def _parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog=PROG,
        description="Versions, TPU chips and HBM, active/skipped patches and known problems.",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON (for scripts)")
    parser.add_argument(
        "--import-targets",
        action="store_true",
        help="import every patch's target module (Transformers, Accelerate, the optional libraries installed) so "
        "each patch is applied or skipped in this process, its checks run (slower: seconds to a minute)",
    )
    doctor_fit.add_arguments(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = parse(_parser(), argv)
    if isinstance(args, int):  # --help, or a usage error (already said)
        return args
    return running.run(PROG, lambda: _main(args))


def _main(args: argparse.Namespace) -> int:
    doctor_fit.check(args)
    if args.fit is not None:
        return doctor_fit.report(args)
    report = collect(import_targets=args.import_targets)
    if args.json:
        print(json.dumps(report, indent=2, sort_keys=False))
    else:
        print(format_text(report))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
