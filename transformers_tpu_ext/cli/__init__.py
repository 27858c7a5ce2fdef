"""The ``transformers-tpu`` command: ``demo``, ``launch``, ``doctor``, ``warmup`` and ``selftest``.

Each subcommand lives in its own module exposing ``main(argv: list[str] | None) -> int``; this
file only dispatches, so ``transformers-tpu launch ...`` hands torchrun's options through untouched.
It follows the conventions of ``accelerate`` and ``torchrun``: ``-h``/``--help`` prints the help on
stdout and exits 0, ``-V``/``--version`` the version; no command, or an unknown one, is a usage
error with exit status 2.

Every command answers a mistake in one line on stderr, ``<prog>: error: <what is wrong and what to
do>``: exit status 2 for a bad argument or setting (said before any model loads or worker starts,
:mod:`.args`), 1 for a failure while working (``TRANSFORMERS_TPU_EXT_VERBOSITY=debug`` shows its
traceback, :mod:`.running`). Never a traceback otherwise.
"""

from __future__ import annotations

import difflib
import importlib
import sys

PROG = "transformers-tpu"
USAGE = f"usage: {PROG} [-h] [-V] <command> [<args>]"

COMMANDS = {
    "demo": ("transformers_tpu_ext.cli.demo", "run the guide's generation example (simulated TPU without a chip)"),
    "launch": ("transformers_tpu_ext.cli.launch", "torchrun with the TPU launch environment prepared"),
    "doctor": ("transformers_tpu_ext.cli.doctor", "versions, chips, patches, settings and known problems"),
    "warmup": ("transformers_tpu_ext.cli.warmup", "compile every bucket of a model's work into the compile cache"),
    "selftest": ("transformers_tpu_ext.cli.selftest", "check the plugin's claims on this chip against the CPU (simulated without one)"),
}


def _help() -> str:
    lines = [USAGE, "", "Plain Hugging Face Transformers code on Cloud TPUs (torch_tpu).", "", "commands:"]
    lines += [f"  {name:<15} {help_}" for name, (_, help_) in COMMANDS.items()]
    lines += [
        "",
        "options:",
        f"  {'-h, --help':<15} show this help message and exit",
        f"  {'-V, --version':<15} show the version and exit",
        "",
        f"Run `{PROG} <command> --help` for a command's options.",
    ]
    return "\n".join(lines)


def _usage_error(message: str) -> int:
    print(f"{PROG}: error: {message}", file=sys.stderr)
    return 2


def _choices(given: str | None = None) -> str:
    close = difflib.get_close_matches(given, COMMANDS, n=1) if given else []
    meant = f"did you mean {close[0]!r}? " if close else ""
    return f"({meant}choose from {', '.join(COMMANDS)}; `{PROG} --help` says what each does)"


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        return _usage_error(f"a command is required {_choices()}")
    if args[0] in {"-h", "--help", "help"}:
        print(_help())
        return 0
    if args[0] in {"-V", "--version"}:
        from .. import __version__

        print(f"transformers-tpu-ext {__version__}")
        return 0
    command, rest = args[0], args[1:]
    if command not in COMMANDS:
        what = "option" if command.startswith("-") else "command"
        return _usage_error(f"unknown {what} {command!r} {_choices(command)}")
    module = importlib.import_module(COMMANDS[command][0])
    return int(module.main(rest) or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
