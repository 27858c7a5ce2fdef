"""The pytest plugin that runs one documentation page's examples (loaded with ``-p sybil_pages``).

``tests/docs/test_docs.py`` starts ``python -m pytest -p sybil_pages PAGE`` in a fresh process per page,
in the page's own working directory, with the environment the page is read in (the simulated TPU,
tiny stand-ins for the Hub models it names, no network). Sybil (https://sybil.readthedocs.io) parses
the page; each example is one pytest item, evaluated in order in one namespace per page:

- ```` ```python ```` blocks run as written; those with ``>>>`` prompts are doctests (shown output checked).
  A block whose first line is ``# NAME.py`` is a file the page asks you to create: it is written to
  ``NAME.py`` in the working directory, for a later shell block to run.
- ```` ```bash ```` blocks run with ``bash -e -o pipefail`` and must succeed.
- ```` ```console ```` blocks are ``$ command`` lines followed by the output shown; the output must match
  (``...`` stands for anything, whitespace is normalised).
- ```` ```text ````, ```` ```json ```` and the others are shown, not run.

Directives, HTML comments so the rendered page does not show them:

- ``<!-- skip: next "why" -->`` (Sybil's): the next example is skipped, with the reason in the page's source;
- ``<!-- invisible-code-block: python ... -->`` (Sybil's): code the page needs and does not show;
- ``<!-- docs: background PORT -->``: the next shell block starts a server; it runs in the background
  until the page ends, and the next example waits until ``127.0.0.1:PORT`` accepts connections.
"""

from __future__ import annotations

import doctest
import os
import re
import shlex
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

from sybil import Example, Region, Sybil
from sybil.evaluators.python import PythonEvaluator
from sybil.parsers.markdown import CodeBlockParser, PythonCodeBlockParser, SkipParser
from sybil.parsers.markdown.lexers import DirectiveInHTMLCommentLexer

#: Seconds a shell block may take (a multi-process launch on two loaded cores takes minutes).
SHELL_TIMEOUT = float(os.environ.get("DOCS_SHELL_TIMEOUT", "900"))
#: Seconds a background server may take to accept connections.
SERVER_TIMEOUT = 600
_FILE = re.compile(r"\A#\s*(?P<name>[\w./-]+\.py)\b")
_BACKGROUND = "_docs_background"


# -- python: files, or code ------------------------------------------------------------------------


class _PythonOrFile(PythonEvaluator):
    def __call__(self, example: Example) -> str | None:
        match = _FILE.match(example.parsed)
        if match:
            path = Path(match.group("name"))
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(example.parsed)
            return None
        return super().__call__(example)


# -- shell -----------------------------------------------------------------------------------------


def _shell(script: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", "-e", "-o", "pipefail", "-c", script], capture_output=True, text=True, timeout=SHELL_TIMEOUT,
        stdin=subprocess.DEVNULL,
    )


def _wait_for_port(port: int, server: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + SERVER_TIMEOUT
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise AssertionError(f"the server stopped (exit {server.returncode}):\n{log.read_text()[-4000:]}")
        with socket.socket() as probe:
            probe.settimeout(1)
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(1)
    raise AssertionError(f"nothing accepted connections on port {port} after {SERVER_TIMEOUT} s:\n{log.read_text()[-4000:]}")


def _evaluate_bash(example: Example) -> str | None:
    background = example.namespace.pop(_BACKGROUND + "_next", None)
    if background is not None:
        log = Path(f"background-{background}.log")
        server = subprocess.Popen(
            ["bash", "-c", "exec " + example.parsed.strip()], stdout=log.open("w"), stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True,
        )
        example.namespace.setdefault(_BACKGROUND, []).append(server)
        _wait_for_port(background, server, log)
        return None
    proc = _shell(example.parsed)
    if proc.returncode != 0:
        return f"exit status {proc.returncode}\n--- stdout\n{proc.stdout[-6000:]}\n--- stderr\n{proc.stderr[-6000:]}"
    return None


_CHECKER = doctest.OutputChecker()
_FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


def _console_steps(text: str) -> list[tuple[str, str]]:
    steps: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        if line.startswith("$ "):
            steps.append((line[2:], []))
        elif steps:
            steps[-1][1].append(line)
    return [(command, "\n".join(lines).strip() + "\n") for command, lines in steps]


def _evaluate_console(example: Example) -> str | None:
    """Each ``$ command``'s output must match what follows it: its stdout, its stderr, or both (in that order)."""
    for command, expected in _console_steps(example.parsed):
        proc = _shell(command)
        outputs = [proc.stdout, proc.stderr, proc.stdout + proc.stderr]
        if not any(_CHECKER.check_output(expected, out.strip() + "\n", _FLAGS) for out in outputs):
            return (f"$ {command}\n--- expected\n{expected}--- got (exit status {proc.returncode})\n"
                    f"{proc.stdout}--- stderr\n{proc.stderr[-4000:]}")
    return None


# -- directives ------------------------------------------------------------------------------------


def _docs_directive(example: Example) -> None:
    words = shlex.split(example.parsed)
    if words[:1] == ["background"] and len(words) == 2:
        example.namespace[_BACKGROUND + "_next"] = int(words[1])
        return
    raise ValueError(f"unknown docs directive {example.parsed!r}")


class DocsDirectiveParser:
    """``<!-- docs: ... -->`` directives."""

    def __init__(self) -> None:
        self.lexer = DirectiveInHTMLCommentLexer(directive="docs", arguments=".+?")

    def __call__(self, document: Any) -> Any:
        for lexed in self.lexer(document):
            yield Region(lexed.start, lexed.end, lexed.lexemes["arguments"], _docs_directive)


def _teardown(namespace: dict) -> None:
    for server in namespace.get(_BACKGROUND, []):
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGTERM)
            try:
                server.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)


_python = PythonCodeBlockParser()
_python.codeblock_parser._evaluator = _PythonOrFile()  # files named by their first line are written, not run

pytest_collect_file = Sybil(
    parsers=[
        _python,
        CodeBlockParser("bash", _evaluate_bash),
        CodeBlockParser("console", _evaluate_console),
        SkipParser(),
        DocsDirectiveParser(),
    ],
    patterns=["*.md"],
    path=str(Path(__file__).resolve().parents[2]),  # the pages of the repository
    teardown=_teardown,
).pytest()
