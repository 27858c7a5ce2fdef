"""``transformers-tpu selftest``: does what this project claims hold on the chip this runs on?

A fixed battery of checks (:data:`transformers_tpu_ext.cli.selftest_checks.CHECKS`), each one a
claim of the plugin tested on the TPU against plain Transformers on the CPU, with tiny
context-sensitive models built locally (nothing is downloaded). Each check passes, fails with the
difference it saw, or is skipped with the reason; the report gives its wall time, the versions of
torch, torch_tpu, libtpu, Transformers and Accelerate (doctor's), and ``--json PATH`` writes it all.

Without a TPU it installs the simulated TPU and runs the same battery there, and says so
("simulated"): that run is part of the project's CI. On a real chip it also times what only a chip
can time (the host decode loop against the device loop per token, a first start against a second
one) and prints the ratios; on the simulated TPU timings mean nothing and it prints that instead.
See ``docs/selftest.md``.

The exit status is 0 when no check failed, 1 when one did (or the battery could not run: one line,
:mod:`.running`), 2 for a usage error (one line, before anything runs).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import time
import traceback
from dataclasses import asdict
from typing import Any, Callable, Iterator, Sequence

from . import running
from .args import CommandError, Parser, check_settings, parse, say
from .selftest_battery import Check, CheckFailed, Context, Result, Skip

__all__ = ["Check", "CheckFailed", "Context", "Result", "Skip", "main", "run_battery"]

PROG = "transformers-tpu selftest"
#: The distributions the report names (doctor's version reporting gives their versions).
VERSIONS = ("torch", "torch_tpu", "libtpu", "transformers", "accelerate")
#: The simulated TPU the battery installs when there is no chip (small HBM: the serving cache is sized from it).
SIMULATED = dict(chips=1, generation="v6e", hbm_bytes="256MiB")
NOT_MEANINGFUL = "timings on the simulated TPU are not meaningful (CPU-backed): run on a TPU VM for them"



def _cpu_seconds() -> float:
    """CPU time of this process and of the child processes it waited for (compile_cache's, ddp's)."""
    times = os.times()
    return times.user + times.system + times.children_user + times.children_system


def _outcome(check: Check, ctx: Context) -> Result:
    start, cpu = time.perf_counter(), _cpu_seconds()
    try:
        facts = check.run(ctx) or {}
        result = Result(check.name, "pass", facts=facts)
    except Skip as skip:
        result = Result(check.name, "skip", detail=str(skip) or "skipped")
    except AssertionError as failure:
        result = Result(check.name, "fail", detail=str(failure) or "assertion failed")
    except Exception as error:  # noqa: BLE001 - an error is a failed check, with where it came from
        where = traceback.extract_tb(error.__traceback__)[-1]
        result = Result(
            check.name, "fail", detail=f"{type(error).__name__}: {error} ({os.path.basename(where.filename)}:{where.lineno})"
        )
    result.seconds = round(time.perf_counter() - start, 2)
    result.cpu_seconds = round(_cpu_seconds() - cpu, 2)
    return result


def run_battery(checks: Sequence[Check], ctx: Context, echo: Callable[[str], None] | None = None) -> list[Result]:
    """Run ``checks`` in order; an exception in one is that check's failure, never the battery's."""
    results = []
    for check in checks:
        result = _outcome(check, ctx)
        results.append(result)
        if echo is not None:
            echo(_line(result))
    return results


def _line(result: Result) -> str:
    mark = {"pass": "PASS", "fail": "FAIL", "skip": "SKIP"}[result.status]
    text = f"{mark:<5} {result.name:<24} {result.seconds:>7.2f} s"
    return f"{text}  {result.detail}" if result.detail else text


@contextlib.contextmanager
def _device(mode: str) -> Iterator[tuple[bool, Any]]:
    """(simulated, simulator): the real TPU when there is one, else the simulated TPU (installed here)."""
    import torch  # noqa: F401 - activates the plugin (and torch_tpu) through their entry points

    import transformers_tpu_ext  # noqa: F401 - in case entry points are disabled
    from transformers_tpu_ext import backend, testing

    if mode != "always" and backend.tpu_available() and not testing.is_installed():
        yield False, None
        return
    if mode == "never":
        raise CommandError("no TPU found and --simulate never: run it on a TPU VM, or drop --simulate never "
                           "to run the checks on the simulated TPU", exit_code=1)
    sim = testing.simulated_tpu()  # installed from TRANSFORMERS_TPU_EXT_SIMULATE (or by a test): keep its configuration
    if sim is None or sim.is_parked:
        sim = testing.install(**SIMULATED)
    yield True, sim


def _versions() -> dict[str, str | None]:
    from .doctor import _versions as doctor_versions

    report = doctor_versions()
    return {name: report.get(name, {}).get("installed") for name in VERSIONS}


def _chip() -> dict[str, Any] | None:
    from .. import backend

    info = backend.chip_info()
    return None if info is None else {"name": info.name, "chips": info.count, "hbm_bytes": info.total_memory}


def _ratios(ctx: Context) -> dict[str, Any]:
    if ctx.simulated:
        return {"note": NOT_MEANINGFUL}
    ratios: dict[str, Any] = dict(ctx.timings)
    host, device = ctx.timings.get("host_loop_ms_per_token"), ctx.timings.get("device_loop_ms_per_token")
    if host and device:
        ratios["host_over_device_per_token"] = round(host / device, 3)
    first, second = ctx.timings.get("first_start_s"), ctx.timings.get("second_start_s")
    if first and second:
        ratios["first_over_second_start"] = round(first / second, 3)
    return ratios


def report(results: Sequence[Result], ctx: Context, seconds: float) -> dict[str, Any]:
    from .. import __version__

    counts = {status: sum(r.status == status for r in results) for status in ("pass", "fail", "skip")}
    return {
        "transformers_tpu_ext": __version__,
        "device": "tpu (simulated)" if ctx.simulated else "tpu",
        "simulated": ctx.simulated,
        "chip": _chip(),
        "versions": _versions(),
        "checks": [asdict(r) for r in results],
        "summary": counts,
        "timings": _ratios(ctx),
        "seconds": round(seconds, 2),
        "cpu_seconds": round(_cpu_seconds(), 2),  # this process's since it started, and its children's
    }


def _print_summary(data: dict[str, Any]) -> None:
    counts = data["summary"]
    print(f"\n{counts['pass']} passed, {counts['fail']} failed, {counts['skip']} skipped in {data['seconds']} s "
          f"({data['cpu_seconds']} s of CPU) on {data['device']}")
    timings = data["timings"]
    if "note" in timings:
        print(f"timings: {timings['note']}")
    else:
        for key, value in timings.items():
            print(f"timing: {key} = {value}")


def _parser() -> argparse.ArgumentParser:
    parser = Parser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", metavar="PATH", help="write the report as JSON to PATH ('-': stdout)")
    parser.add_argument("--only", metavar="NAMES", help="a comma list of checks to run (default: all)")
    parser.add_argument("--ddp", action="store_true", help="run the DDP check on the simulated TPU too (2 processes)")
    parser.add_argument("--list", action="store_true", help="list the checks and what each proves, then exit")
    parser.add_argument(
        "--simulate", choices=["auto", "always", "never"], default="auto",
        help="use the simulated TPU: when no real TPU is found (auto), always, or never",
    )
    return parser


def select(names: str | None) -> list[Check]:
    from .selftest_checks import CHECKS

    if names is None:
        return list(CHECKS)
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    known = {c.name: c for c in CHECKS}
    unknown = [n for n in wanted if n not in known]
    if not wanted:
        raise ValueError(f"--only {names!r} names no check: pass a comma list of them ({', '.join(known)}), or drop --only")
    if unknown:
        raise ValueError(f"--only: unknown check(s) {', '.join(unknown)} (choose from {', '.join(known)})")
    return [known[n] for n in wanted]


def check_report_path(path: str | None) -> None:
    """Raise :class:`CommandError` when ``--json PATH`` could not be written (before the battery runs, not after)."""
    if path is None or path == "-":
        return
    if os.path.isdir(path):
        raise CommandError(f"--json {path!r} is a directory: pass a file path (or - for stdout)")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise CommandError(f"--json {path!r}: no such directory {folder!r}; create it or pass another path (or - for stdout)")
    if not os.access(folder, os.W_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        raise CommandError(f"--json {path!r} cannot be written: pass a writable path (or - for stdout)")


def main(argv: list[str] | None = None, checks: Sequence[Check] | None = None) -> int:
    args = parse(_parser(), argv)
    if isinstance(args, int):  # --help, or a usage error (already said)
        return args
    try:
        battery = list(checks) if checks is not None else select(args.only)
    except ValueError as error:
        say(PROG, str(error))
        return 2
    if args.list:
        for check in battery:
            print(f"{check.name:<24} {check.proves}")
        return 0
    return running.run(PROG, lambda: _run(args, battery))


def _run(args: argparse.Namespace, battery: list[Check]) -> int:
    check_report_path(args.json)
    check_settings()
    start = time.perf_counter()
    with _device(args.simulate) as (simulated, sim), tempfile.TemporaryDirectory(prefix="tpu-selftest-") as tmp:
        where = "the SIMULATED TPU (no TPU found: the checks run, timings are not measured)" if simulated else "the TPU"
        print(f"{PROG}: {len(battery)} checks on {where}")
        ctx = Context(simulated=simulated, sim=sim, tmp=tmp, options={"ddp": args.ddp})
        results = run_battery(battery, ctx, echo=lambda line: print(line, flush=True))
        data = report(results, ctx, time.perf_counter() - start)
    _print_summary(data)
    if args.json:
        text = json.dumps(data, indent=2, default=str)
        if args.json == "-":
            print(text)
        else:
            with open(args.json, "w", encoding="utf-8") as handle:
                handle.write(text + "\n")
    return 1 if data["summary"]["fail"] else 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
