"""The ``transformers-tpu`` command: ``demo``, ``launch`` and ``doctor``.

Each subcommand lives in its own module exposing ``main(argv: list[str] | None) -> int``; this
file only dispatches, so ``transformers-tpu launch ...`` hands torchrun's options through untouched.
"""

from __future__ import annotations

import importlib
import sys

COMMANDS = {
    "demo": ("transformers_tpu_ext.demo", "run the guide's generation example (simulated TPU without a chip)"),
    "launch": ("transformers_tpu_ext.launch", "torchrun with the TPU launch environment prepared"),
    "doctor": ("transformers_tpu_ext.doctor", "versions, chips, patches and known problems"),
}


def _usage() -> str:
    lines = ["usage: transformers-tpu <command> [options]", "", "commands:"]
    lines += [f"  {name:<8} {help_}" for name, (_, help_) in COMMANDS.items()]
    lines += ["", "Run `transformers-tpu <command> --help` for a command's options."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in {"-h", "--help", "help"}:
        print(_usage())
        return 0
    if args[0] in {"-V", "--version"}:
        from . import __version__

        print(f"transformers-tpu-ext {__version__}")
        return 0
    command, rest = args[0], args[1:]
    if command not in COMMANDS:
        print(f"transformers-tpu: unknown command {command!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[command][0])
    return int(module.main(rest) or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
