"""How every ``transformers-tpu`` command runs its work: quiet, and failing in one line.

:func:`run` calls a command's work with the libraries' known noise dropped (:func:`quiet_library_noise`)
and turns what escapes into one line on stderr, ``<prog>: error: ...``:

- a :class:`~.args.CommandError` (a bad argument, a missing TPU, a model that cannot be found): its
  message, with its exit status (2 or 1);
- any other exception (inside ``from_pretrained``, ``generate``, a warm-up): ``<Type>: <message>``
  and how to see the traceback, exit status 1. With ``TRANSFORMERS_TPU_EXT_VERBOSITY=debug`` (the
  plugin's own verbosity, docs/logging.md) the traceback is printed first;
- Ctrl-C: ``interrupted``, exit status 130.
"""

from __future__ import annotations

import contextlib
import logging
import os
import traceback
from collections.abc import Callable, Iterator

from ..log import LEVELS, VERBOSITY_ENV
from .args import CommandError, say

__all__ = ["DEBUG_HINT", "NOISE", "debugging", "describe", "quiet_library_noise", "run"]

#: What a runtime failure's line ends with.
DEBUG_HINT = f"rerun with {VERBOSITY_ENV}=debug for the traceback"
#: Characters of an exception's message kept in the line.
MESSAGE_CHARS = 500

#: Lines libraries log while a command imports them that say nothing about the command (issue 29):
#: torchao's optional CUDA kernels, which a CPU or TPU host cannot load (Transformers imports torchao), and
#: torch's deprecation of ``register_constant()`` on enums, which torchao calls. (logger, words of the
#: message): dropped in the commands only, while they run; never for user code.
NOISE: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("torchao", ("Failed to load ", "torchao", ".so")),
    ("torch.utils._pytree", ("is an Enum subclass", "register_constant()")),
)


class _DropNoise(logging.Filter):
    def __init__(self, words: tuple[str, ...]) -> None:
        super().__init__()
        self.words = words

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            text = record.getMessage()
        except Exception:  # noqa: BLE001 - a record we cannot format is not ours to drop
            return True
        return not all(word in text for word in self.words)


@contextlib.contextmanager
def quiet_library_noise() -> Iterator[None]:
    """Drop the :data:`NOISE` records (only those) while a command runs."""
    filters = [(logging.getLogger(name), _DropNoise(words)) for name, words in NOISE]
    for logger, noise in filters:
        logger.addFilter(noise)
    try:
        yield
    finally:
        for logger, noise in filters:
            logger.removeFilter(noise)


def debugging() -> bool:
    """Whether ``TRANSFORMERS_TPU_EXT_VERBOSITY=debug`` (or ``detail``) asks for tracebacks."""
    return LEVELS.get(os.environ.get(VERBOSITY_ENV, "").strip().lower()) == logging.DEBUG


def describe(error: BaseException) -> str:
    """``<Type>: <message>`` on one line, the message cut to :data:`MESSAGE_CHARS` characters."""
    text = " ".join(str(error).split())
    if len(text) > MESSAGE_CHARS:
        text = text[: MESSAGE_CHARS - 3].rstrip() + "..."
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def run(prog: str, work: Callable[[], int | None]) -> int:
    """``work()``'s exit status (``None`` is 0), or one line on stderr and 2, 1 or 130 (see the module)."""
    try:
        with quiet_library_noise():
            return int(work() or 0)
    except CommandError as error:
        say(prog, str(error))
        return error.exit_code
    except KeyboardInterrupt:
        say(prog, "interrupted")
        return 130
    except Exception as error:  # noqa: BLE001 - the command's answer is one line, the traceback on request
        if debugging():
            traceback.print_exc()
            say(prog, describe(error))
        else:
            say(prog, f"{describe(error)} ({DEBUG_HINT})")
        return 1
