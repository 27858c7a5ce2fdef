"""``transformers-tpu launch``: torchrun with the TPU launch environment prepared.

torch_tpu needs ``TORCH_TPU_SLICEBUILDER_ADDRESSES``, ``TORCH_TPU_TOPOLOGY`` (and more, on
multi-host) in every worker's environment before it starts; plain ``torchrun`` does not set them,
so its ranks fail (or abort with SIGABRT). This command checks the request up front, calls
``torch.tpu.distributed.set_tpu_launch_env()`` once, in this (parent) process, then runs torchrun
with the same arguments; the workers inherit the variables.

Same command three ways::

    transformers-tpu launch --nproc_per_node=4 generate.py --max-new-tokens 32
    python -m transformers_tpu_ext.launch --nproc_per_node=4 generate.py --max-new-tokens 32
    transformers_tpu_ext.launch.main(["--nproc_per_node=4", "generate.py", "--max-new-tokens", "32"])

``--nproc_per_node`` defaults to the chips attached to the host (``auto`` and ``tpu`` mean the same).
Errors a user can cause (no script, a script or module that does not exist, no TPU backend, a
process count the chip has no topology for, ``--nnodes`` disagreeing with ``TPU_WORKER_HOSTNAMES``,
a host of a slice that does not know its index or is given another one, a rendezvous that numbers
hosts by arrival, an invalid ``TRANSFORMERS_TPU_EXT_*`` setting) end with one line saying what to do
and a non-zero exit status before any worker starts, never a traceback. The checks that need no chip
come first (:func:`check_arguments`): a machine without a TPU still names a bad argument.

On a slice of several hosts, each host is the node its ``NODE_RANK`` names (torchrun reads only
``--node_rank``), and the hosts meet at the slice's first host (:func:`multi_host`). ``--help`` is torchrun's, with TPU wording for the options this command changes. See
``docs/launching.md``.
"""

from __future__ import annotations

import os
import shutil
import sys
from argparse import Namespace
from importlib.machinery import PathFinder
from typing import Any, NoReturn

from .. import backend
from ..core import topology
from . import running
from .args import CommandError, check_settings, parse, say

__all__ = ["LaunchError", "check_arguments", "check_script", "main", "prepare", "process_count"]

PROG = "transformers-tpu launch"
USAGE = f"{PROG} [torchrun options] script.py [script args]   (or -m module [args])"
HOSTNAMES_ENV = "TPU_WORKER_HOSTNAMES"
_DESCRIPTION = (
    "Run torchrun on a TPU host: check the process count against the chip's topologies, prepare the "
    "TPU launch environment once (torch.tpu.distributed.set_tpu_launch_env), then launch the "
    "workers. Takes torchrun's options; --nproc_per_node defaults to the chips on this host."
)
_CHIP_WORDS = {"auto", backend.DEVICE_TYPE}
#: torchrun's defaults of the rendezvous options :func:`_parser` leaves unset (read from its parser).
_TORCHRUN_DEFAULTS: dict[str, Any] = {"node_rank": 0, "master_addr": "127.0.0.1", "master_port": None}


class LaunchError(CommandError):
    """A launch request that cannot work; ``str()`` says what to do. ``exit_code`` is 1 or 2."""


#: Help for the torchrun options whose meaning this command changes on TPU (by ``dest``).
_TPU_HELP = {
    "nproc_per_node": (
        "Processes on this host, one per TPU chip: a count the chip generation has a topology for ("
        + "; ".join(f"{gen}: {', '.join(map(str, counts))}" for gen, counts in topology.TOPOLOGIES.items())
        + "), at most the chips on the host; or auto/tpu. Default: every chip on the host."
    ),
    "nnodes": (
        "Number of hosts of the TPU slice: one number (a slice has a fixed size, no min:max range), "
        "equal to the number of hosts in TPU_WORKER_HOSTNAMES. Default: 1."
    ),
    "training_script": (
        "The training script each process runs (one process per TPU chip, each seeing its chip as "
        "tpu:0), followed by its arguments; with -m, a module. Checked before any worker starts."
    ),
    "training_script_args": "The training script's own arguments.",
}


def _parser() -> Any:
    from torch.distributed.run import get_args_parser

    parser = get_args_parser()
    parser.prog = PROG
    parser.usage = USAGE
    parser.description = _DESCRIPTION
    for action in parser._actions:
        if action.dest in _TPU_HELP:
            action.help = _TPU_HELP[action.dest]
    parser.error = _usage_error  # type: ignore[method-assign]
    # Tell "not given" apart from torchrun's defaults (its PET_* variables still count as given);
    # prepare() fills in what is left unset.
    for dest in ("nproc_per_node", *_TORCHRUN_DEFAULTS):
        if dest in _TORCHRUN_DEFAULTS:
            _TORCHRUN_DEFAULTS[dest] = parser.get_default(dest)
        if f"PET_{dest.upper()}" not in os.environ:
            parser.set_defaults(**{dest: None})
    return parser


def _usage_error(message: str) -> NoReturn:
    """argparse's error, in one line (torchrun's usage runs to 30 lines): what is wrong and what to do."""
    if "training_script" in message:
        message = "no training script given: pass the script to run (or -m module), after the torchrun options"
    say(PROG, f"{message} (see --help)")
    raise SystemExit(2)


def check_script(args: Namespace, cwd: str | None = None) -> None:
    """Raise :class:`LaunchError` unless what the workers will run exists (no worker is started yet).

    A script path must be a file (relative to ``cwd``); ``-m`` a module findable from ``cwd`` and
    ``sys.path`` (found without importing it); ``--no-python`` an executable.
    """
    cwd = os.getcwd() if cwd is None else cwd
    target = args.training_script
    if getattr(args, "module", False):
        if _find_module(target, [cwd, *sys.path]) is None:
            raise LaunchError(
                f"-m {target}: no module named {target!r} in {cwd} or on the Python path; "
                "pass a module the workers can import (python -m style), or a script path without -m."
            )
        return
    path = target if os.path.isabs(target) else os.path.join(cwd, target)
    if getattr(args, "no_python", False):
        if not (os.path.isfile(path) and os.access(path, os.X_OK)) and shutil.which(target) is None:
            raise LaunchError(f"--no-python {target}: no such executable (nor on PATH); pass a command the workers can run.")
        return
    if not os.path.isfile(path):
        what = "is a directory" if os.path.isdir(path) else "no such file"
        raise LaunchError(f"can't open file {target!r}: {what} (in {cwd}); pass the path of the training script.")


def _find_module(name: str, path: list[str]) -> Any:
    """The spec of ``name`` as the workers would find it, without importing anything.

    The top-level package is looked up on ``path`` and then by the interpreter's other finders
    (editable installs register an import hook on ``sys.meta_path`` instead of a path entry).
    """
    spec = None
    for index, part in enumerate(name.split(".")):
        spec = PathFinder.find_spec(part, path)
        if spec is None and index == 0:
            spec = _meta_path_spec(part)
        if spec is None:
            return None
        path = list(spec.submodule_search_locations or [])
    return spec


def _meta_path_spec(name: str) -> Any:
    for finder in sys.meta_path:
        if finder is PathFinder or not hasattr(finder, "find_spec"):
            continue
        try:
            spec = finder.find_spec(name, None)
        except Exception:  # noqa: BLE001 - a broken finder is not the user's mistake
            continue
        if spec is not None and spec.origin not in (None, "built-in", "frozen"):
            return spec
    return None


def _nnodes(value: str) -> int:
    parts = str(value).split(":")
    try:
        low, high = (int(parts[0]), int(parts[-1])) if len(parts) <= 2 else (None, None)
    except ValueError:
        low = high = None
    if low is None or low < 1:
        raise LaunchError(f"--nnodes={value} is not a number of hosts; pass e.g. --nnodes=1.")
    if low != high:
        raise LaunchError(
            f"--nnodes={value} asks for an elastic range, but a TPU slice has a fixed number of hosts: "
            f"pass one number (e.g. --nnodes={high})."
        )
    return low


def _check_hosts(nnodes: int, environ: dict[str, str]) -> None:
    raw = environ.get(HOSTNAMES_ENV, "").strip()
    if not raw:
        if nnodes > 1:
            raise LaunchError(
                f"--nnodes={nnodes} needs {HOSTNAMES_ENV}: set it to the comma-separated hostnames of the "
                f"slice's {nnodes} workers (the same on every host), with NODE_RANK set per host."
            )
        return
    hosts = [h.strip() for h in raw.split(",") if h.strip()]
    if len(hosts) != nnodes:
        raise LaunchError(
            f"--nnodes={nnodes} disagrees with {HOSTNAMES_ENV}, which lists {len(hosts)} "
            f"host{'' if len(hosts) == 1 else 's'} ({', '.join(hosts)}). Run the same command on every "
            f"host with --nnodes={len(hosts)}, or fix {HOSTNAMES_ENV}."
        )


#: Where a TPU VM says which host of the slice it is (torch_tpu's ``set_tpu_launch_env`` sets the
#: first from the chip coordinates; Kubernetes indexed jobs set the second).
HOST_INDEX_ENV = ("NODE_RANK", "JOB_COMPLETION_INDEX")


def _hosts(environ: dict[str, str]) -> list[str]:
    return [h.strip() for h in environ.get(HOSTNAMES_ENV, "").split(",") if h.strip()]


def check_rendezvous(nnodes: int, *, rdzv_backend: str | None, standalone: bool) -> None:
    """Raise :class:`LaunchError` for a rendezvous that cannot give a TPU slice's hosts their ranks.

    Several hosts must be node ``i`` where the slice says host ``i`` is: torchrun's static
    rendezvous (``--node_rank``, ``--master_addr``, ``--master_port``) does that; a dynamic one
    (``--rdzv_backend=c10d``, ``--standalone``) numbers the hosts in the order they arrive.
    """
    if nnodes <= 1:
        return
    if standalone:
        raise LaunchError(
            f"--standalone starts a rendezvous on this host alone, but --nnodes={nnodes} spans several hosts: "
            "drop --standalone (the hosts meet at --master_addr/--master_port, the first host of "
            f"{HOSTNAMES_ENV} by default)."
        )
    if (rdzv_backend or "static") != "static":
        raise LaunchError(
            f"--rdzv_backend={rdzv_backend} numbers the hosts in the order they arrive, but on a TPU slice host i "
            f"must be node i (its chips are the slice's i-th): drop --rdzv_backend and let each "
            "host take its rank from NODE_RANK (the static rendezvous at --master_addr/--master_port)."
        )


def multi_host(
    nnodes: int, *, node_rank: int | None, master_addr: str | None, master_port: int | None, environ: dict[str, str]
) -> tuple[int, str | None, int | None]:
    """``(node_rank, master_addr, master_port)`` for torchrun on one host of a slice of ``nnodes``.

    ``node_rank``, ``master_addr`` and ``master_port`` are what the user passed (``None``: not
    given); ``environ`` is the environment after ``set_tpu_launch_env``. The node rank is the host
    index the TPU environment names (``NODE_RANK``, else ``JOB_COMPLETION_INDEX``); a ``--node_rank``
    that disagrees with it, or neither, is a :class:`LaunchError`. The master address defaults to
    ``MASTER_ADDR``, else the first host of ``TPU_WORKER_HOSTNAMES`` (torchrun's 127.0.0.1 is another
    machine on every other host); the port to ``MASTER_PORT``, else torchrun's default (``None``).
    With one host, torchrun's defaults.
    """
    default = _TORCHRUN_DEFAULTS
    if nnodes <= 1:
        return (
            default["node_rank"] if node_rank is None else node_rank,
            default["master_addr"] if master_addr is None else master_addr,
            default["master_port"] if master_port is None else master_port,
        )
    source = next((name for name in HOST_INDEX_ENV if str(environ.get(name, "")).strip()), None)
    if source is None and node_rank is None:
        raise LaunchError(
            f"--nnodes={nnodes} needs this host's index in the slice: set NODE_RANK (0 to {nnodes - 1}, the "
            f"position of this host in {HOSTNAMES_ENV}) on every host; on a TPU VM "
            "torch.tpu.distributed.set_tpu_launch_env() sets it."
        )
    if source is not None:
        raw = str(environ[source]).strip()
        try:
            index = int(raw)
        except ValueError:
            raise LaunchError(f"{source}={raw!r} is not a host index: set it to a number from 0 to {nnodes - 1}.") from None
        if node_rank is not None and int(node_rank) != index:
            raise LaunchError(
                f"--node_rank={node_rank} disagrees with {source}={index}, this host's index in the TPU slice: "
                f"drop --node_rank (the launcher takes it from {source}) or fix {source}."
            )
        node_rank, what = index, f"{source}={index}"
    else:
        what = f"--node_rank={node_rank}"
    if not 0 <= int(node_rank) < nnodes:
        raise LaunchError(f"{what} is not a host of --nnodes={nnodes}: pass a number from 0 to {nnodes - 1}.")
    if master_addr is None:
        master_addr = str(environ.get("MASTER_ADDR", "")).strip() or _hosts(environ)[0]
    if master_port is None and str(environ.get("MASTER_PORT", "")).strip():
        raw = str(environ["MASTER_PORT"]).strip()
        try:
            master_port = int(raw)
        except ValueError:
            raise LaunchError(f"MASTER_PORT={raw!r} is not a port number.") from None
    return int(node_rank), master_addr, default["master_port"] if master_port is None else master_port


def _tpu_module() -> Any:
    return getattr(sys.modules["torch"], "tpu")


def process_count(requested: Any) -> int | None:
    """The ``--nproc_per_node`` asked for: a number >= 1, or ``None`` for every chip (not given, ``auto``,
    ``tpu``). Raises :class:`LaunchError` for anything else. Pure: needs no chip."""
    if requested is None or str(requested).strip().lower() in _CHIP_WORDS:
        return None
    try:
        count = int(str(requested).strip())
    except ValueError:
        raise LaunchError(
            f"--nproc_per_node={requested} is not supported on TPU: pass a number of processes "
            "(one per chip) or auto."
        ) from None
    if count < 1:
        raise LaunchError(f"--nproc_per_node={count}: pass at least 1 (one process per chip).")
    return count


def check_any_topology(count: int) -> None:
    """Raise :class:`LaunchError` when no TPU generation has a topology for ``count`` processes per host
    (what can be said without seeing the chip: 3 processes never run)."""
    if any(count in counts for counts in topology.TOPOLOGIES.values()):
        return
    listed = "; ".join(f"{gen}: {', '.join(map(str, counts))}" for gen, counts in topology.TOPOLOGIES.items())
    raise LaunchError(
        f"--nproc_per_node={count}: no TPU generation has a topology for {count} processes per host "
        f"({listed}); pass one of those counts (at most the chips on the host), or auto."
    )


def check_arguments(args: Namespace, environ: dict[str, str] | None = None) -> int:
    """Every check that needs no chip, in the order a user reads the command: the process count, the
    hosts (``--nnodes``, ``TPU_WORKER_HOSTNAMES``, the rendezvous), the script, the plugin's settings.
    Returns ``nnodes``; raises :class:`LaunchError`."""
    environ = os.environ if environ is None else environ
    nproc = process_count(args.nproc_per_node)
    nnodes = _nnodes(args.nnodes)
    _check_hosts(nnodes, environ)
    check_rendezvous(
        nnodes, rdzv_backend=getattr(args, "rdzv_backend", None), standalone=bool(getattr(args, "standalone", False))
    )
    if getattr(args, "training_script", None) is not None:
        check_script(args)
    try:
        check_settings(environ)
    except CommandError as error:
        raise LaunchError(str(error)) from None
    return nnodes


def prepare(args: Namespace, environ: dict[str, str] | None = None) -> tuple[int, int]:
    """Check ``args`` (parsed torchrun options: first what needs no chip, :func:`check_arguments`; then
    the TPU and the process count against its chips), fill in ``nproc_per_node`` and prepare the launch
    environment. Returns ``(nnodes, nproc_per_node)``; raises :class:`LaunchError` (no worker is started
    then). Fills in ``node_rank``, ``master_addr`` and ``master_port`` for torchrun (:func:`multi_host`)."""
    environ = os.environ if environ is None else environ
    nnodes = check_arguments(args, environ)
    import torch  # noqa: F401 - loads the TPU backend (torch.backends entry points)

    if not backend.tpu_available():
        nproc = process_count(args.nproc_per_node)
        if nproc is not None:
            check_any_topology(nproc)  # a count no chip runs says so first, with or without a chip here
        current = None
        try:
            accelerator = torch.accelerator.current_accelerator()
            current = accelerator.type if accelerator is not None else None
        except Exception:  # noqa: BLE001
            pass
        seen = f"the current accelerator is {current!r}" if current else "PyTorch sees no accelerator"
        raise LaunchError(
            f"No TPU backend found ({seen}). Run on a Cloud TPU VM with torch_tpu installed "
            "(pip install 'transformers-tpu-ext[tpu]'); to rehearse without a chip, set "
            "TRANSFORMERS_TPU_EXT_SIMULATE=1 (the simulated TPU). For CPU or GPU workers use torchrun.",
            exit_code=1,
        )
    chips = backend.device_count()
    try:
        name = str(_tpu_module().get_device_name())
    except Exception as error:  # noqa: BLE001 - e.g. a chip generation this torch_tpu does not know
        raise LaunchError(
            f"the TPU backend cannot name this host's chip (torch.tpu.get_device_name() raised "
            f"{type(error).__name__}: {error}), so no worker can be placed on it: install a torch_tpu "
            "release that knows this chip (transformers-tpu doctor shows what is installed).",
            exit_code=1,
        ) from None

    nproc = process_count(args.nproc_per_node) or chips
    if nproc > chips:
        raise LaunchError(
            f"--nproc_per_node={nproc} but this host has {chips} TPU chip{'' if chips == 1 else 's'} "
            f"({name}); torch_tpu runs one process per chip: pass at most {chips}."
        )
    problem = topology.check_process_count(name, nproc)
    if problem:
        raise LaunchError(problem)

    set_env = getattr(getattr(_tpu_module(), "distributed", None), "set_tpu_launch_env", None)
    if set_env is None:
        raise LaunchError(
            "This TPU backend has no torch.tpu.distributed.set_tpu_launch_env; install torch_tpu>=0.2.0.",
            exit_code=1,
        )
    try:
        set_env(nnodes=nnodes, nproc_per_node=nproc)
    except Exception as error:  # noqa: BLE001 - the backend's own refusal, shown as one line
        raise LaunchError(
            f"torch.tpu.distributed.set_tpu_launch_env(nnodes={nnodes}, nproc_per_node={nproc}) failed "
            f"on {name}: {error}",
            exit_code=1,
        ) from None
    args.node_rank, args.master_addr, args.master_port = multi_host(
        nnodes, node_rank=getattr(args, "node_rank", None), master_addr=getattr(args, "master_addr", None),
        master_port=getattr(args, "master_port", None), environ=environ,
    )
    args.nproc_per_node = str(nproc)
    args.nnodes = str(nnodes)
    return nnodes, nproc


def main(argv: list[str] | None = None) -> int:
    """Check, prepare the TPU launch environment, run torchrun; return the exit status."""
    args = parse(_parser(), list(sys.argv[1:] if argv is None else argv))
    if isinstance(args, int):  # --help, or a usage error (already said)
        return args
    return running.run(PROG, lambda: _launch(args))


def _launch(args: Namespace) -> int:
    prepare(args)
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, record
    from torch.distributed.run import run

    try:
        record(run)(args)
    except ChildFailedError as error:
        print(error.format_msg(), file=sys.stderr)
        _, failure = error.get_first_failure()
        return failure.exitcode if isinstance(failure.exitcode, int) and failure.exitcode > 0 else 1
    except SystemExit as exit_:
        return exit_.code if isinstance(exit_.code, int) else 1
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
