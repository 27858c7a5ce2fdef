"""What the ``transformers-tpu`` commands accept, checked before any work starts (pure: no torch).

Every command answers a bad argument or setting with **one line** on stderr, ``<prog>: error: <what is
wrong and what to do>``, and exit status 2, before it loads a model or starts a worker; a failure
while working is one line too, with exit status 1 (:mod:`.running`). This module holds the pieces
the commands share for the first part:

- :class:`CommandError`: a request that cannot work, with the line to print and the exit status;
- :class:`Parser`: ``argparse`` whose usage errors are that one line (``... (see --help)``), not the
  usage block;
- argument types (:func:`positive_int`, :func:`int_list`, :func:`names`, :func:`dtype`, ...) whose
  messages say what is expected;
- :func:`setting_errors` / :func:`check_settings`: the invalid ``TRANSFORMERS_TPU_EXT_*`` values
  (``settings.problems()``) a command refuses to start with.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import NoReturn

__all__ = [
    "DTYPES",
    "CommandError",
    "Parser",
    "check_settings",
    "dtype",
    "int_list",
    "names",
    "non_negative_int",
    "parse",
    "positive_int",
    "say",
    "setting_errors",
]


class CommandError(Exception):
    """A request that cannot work; ``str()`` is the line after ``<prog>: error:`` and says what to do.
    ``exit_code`` is 2 for a usage error (an argument, a setting), 1 for a failure of the machine or the work."""

    def __init__(self, message: str, exit_code: int = 2) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def say(prog: str, message: str) -> None:
    """Print ``<prog>: error: <message>`` on stderr, as one line whatever ``message`` holds."""
    print(f"{prog}: error: {' '.join(str(message).split())}", file=sys.stderr)


class Parser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` whose usage errors are one line, ``<prog>: error: <message> (see --help)``,
    with exit status 2 (argparse prints its whole usage block first; ``--help`` still shows it)."""

    def error(self, message: str) -> NoReturn:
        say(self.prog, f"{message} (see --help)")
        raise SystemExit(2)


def parse(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace | int:
    """``parser.parse_args(argv)``, or the exit status when argparse ended it (``--help``: 0, a usage error: 2)."""
    try:
        return parser.parse_args(sys.argv[1:] if argv is None else argv)
    except SystemExit as exit_:
        return exit_.code if isinstance(exit_.code, int) else 2


# --------------------------------------------------------------------------------------------
# Argument types (argparse prefixes their message with "argument --option: ")
# --------------------------------------------------------------------------------------------


def _whole(text: str, minimum: int) -> int:
    try:
        value = int(str(text).strip())
    except ValueError:
        value = None
    if value is None or value < minimum:
        raise argparse.ArgumentTypeError(f"expected a whole number >= {minimum}, got {text!r}")
    return value


def positive_int(text: str) -> int:
    """A whole number >= 1 (a count of tokens, rows, chips, steps)."""
    return _whole(text, 1)


def non_negative_int(text: str) -> int:
    """A whole number >= 0."""
    return _whole(text, 0)


#: The seeds ``torch.manual_seed`` takes.
SEED_RANGE = (-(2**63), 2**64 - 1)


def seed(text: str) -> int:
    """A seed ``torch.manual_seed`` accepts."""
    low, high = SEED_RANGE
    try:
        value = int(str(text).strip())
    except ValueError:
        value = None
    if value is None or not low <= value <= high:
        raise argparse.ArgumentTypeError(f"expected a whole number from {low} to {high}, got {text!r}")
    return value


def int_list(text: str, minimum: int = 1, what: str = "numbers") -> list[int]:
    """A comma list of whole numbers >= ``minimum`` (``"1,4,8"``), sorted, without repeats."""
    parts = [part.strip() for part in str(text).split(",") if part.strip()]
    try:
        values = sorted({int(part) for part in parts})
    except ValueError:
        values = []
    if not values or values[0] < minimum:
        raise argparse.ArgumentTypeError(f"expected a comma list of {what} >= {minimum} (e.g. 1,4,8), got {text!r}")
    return values


def names(choices: Iterable[str], what: str) -> Callable[[str], list[str]]:
    """An argparse type: a comma list of ``choices`` (``"v5e,v6e"``), in the order given."""
    known = tuple(choices)

    def parse_names(text: str) -> list[str]:
        given = [part.strip() for part in str(text).split(",") if part.strip()]
        unknown = [name for name in given if name not in known]
        if not given or unknown:
            shown = ", ".join(map(repr, unknown)) if unknown else repr(text)
            raise argparse.ArgumentTypeError(f"unknown {what} {shown}: choose from {', '.join(known)} (a comma list)")
        return given

    return parse_names


#: The dtypes a command loads a model in: the checkpoint's own, or a floating-point type a TPU runs.
DTYPES = ("auto", "bfloat16", "float16", "float32")


def dtype(text: str) -> str:
    """``auto`` or one of :data:`DTYPES` (``torch.bfloat16`` is ``bfloat16``)."""
    name = str(text).strip().removeprefix("torch.")
    if name not in DTYPES:
        raise argparse.ArgumentTypeError(f"unknown dtype {text!r}: choose from {', '.join(DTYPES)}")
    return name


# --------------------------------------------------------------------------------------------
# Settings
# --------------------------------------------------------------------------------------------


def setting_errors(environ: Mapping[str, str] | None = None) -> list[str]:
    """The invalid ``TRANSFORMERS_TPU_EXT_*`` values in ``environ`` (``settings.problems()``), without the
    unknown names (a variable nothing reads is ignored: activation warns about it, a command runs on)."""
    from .. import settings

    environ = os.environ if environ is None else environ
    ignored = set(settings.unknown_names(environ))
    return [problem for problem in settings.problems(environ) if problem not in ignored]


def check_settings(environ: Mapping[str, str] | None = None) -> None:
    """Raise :class:`CommandError` (exit status 2) naming every invalid setting, before any work starts."""
    errors = setting_errors(environ)
    if errors:
        fix = "fix it or unset it" if len(errors) == 1 else "fix them or unset them"
        listed = "; ".join(error.rstrip(". ") for error in errors)
        raise CommandError(f"{listed}: {fix} (every setting: docs/configuration.md)")
