"""The persistent compile cache: whether the plugin points torch_tpu's at a directory, and which (pure).

torch_tpu 0.2.0 keeps compiled programs across processes when ``TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT``
names a directory (off when unset). It reads the variable once, at the process's first compilation,
and stores each program at ``<root>/<fingerprint>/<key>.bin``, the fingerprint made from torch_tpu's
and PJRT's versions (another release never reads those entries); a root whose directory cannot be
created aborts the process at that first compilation. See ``docs/compile-cache.md``.

:func:`plan` decides from plain facts of the environment and the host, and returns the action with
its reason:

- ``leave``: the user configured torch_tpu's cache (any of its cache variables is set): untouched;
- ``off``: ``TRANSFORMERS_TPU_EXT_COMPILE_CACHE=off``; or, by default, no TPU chip on this host, or
  torch_tpu is not installed (the simulated TPU and other backends: ``=on`` or a directory opts in);
  or the root cannot be written (read-only home: torch_tpu would abort); or the backend already
  compiled in this process (it has read its variables: setting them now would only mislead);
- ``set``: the root to set: ``TRANSFORMERS_TPU_EXT_COMPILE_CACHE=<dir>``, or by default
  ``<HF_HOME>/transformers-tpu-ext/compile-cache/torch_tpu-<version>``: one directory per torch_tpu
  release, so entries of an older release are visible (``transformers-tpu doctor``) and removable.

Several processes (the ranks of ``transformers-tpu launch``) share one root: each resolves the same
directory (a child inherits the parent's variable, and then leaves it alone), and torch_tpu writes
entries atomically. No torch, no I/O here: the caller passes what it found.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from ..settings.parser import OFF_WORDS, ON_WORDS, near_word

__all__ = [
    "CACHE_ENV",
    "CASES",
    "CachePlan",
    "Facts",
    "ROOT_ENV",
    "TORCH_TPU_CACHE_VARIABLES",
    "default_root",
    "check_environment",
    "hf_home",
    "parse_setting",
    "plan",
]

#: The plugin's switch: ``auto`` (default), ``on``, ``off``, or a directory.
CACHE_ENV = "TRANSFORMERS_TPU_EXT_COMPILE_CACHE"
#: torch_tpu 0.2.0's persistent (tier-3) cache root: the variable the plugin sets.
ROOT_ENV = "TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT"
#: Every torch_tpu cache variable (0.2.0's names, and the ``INTERNAL`` names of older builds): when
#: the user set any of them, the cache is theirs.
TORCH_TPU_CACHE_VARIABLES = (
    ROOT_ENV,
    "TORCH_TPU_INTERNAL_TIER3_COMPILATION_CACHE_ROOT",
    "TORCH_TPU_TIER2_COMPILATION_CACHE",
    "TORCH_TPU_INTERNAL_TIER2_COMPILATION_CACHE",
)

#: The words of the setting: the settings layer's one on/off vocabulary, ``auto``, and ``none`` (off).
_WORDS = ("auto", "none")


def parse_setting(raw: str | None) -> str:
    """``"auto"``, ``"on"``, ``"off"``, ``"invalid"``, or the directory the user named (never raises).

    The rule (``docs/compile-cache.md``): an on or off word of the settings layer (``on``, ``1``,
    ``enabled``, ``off``, ``0``, ``disable``, ...), ``auto`` or ``none`` is that word; a near miss of one
    (``of``, ``disbale``, ``nope``) is ``"invalid"`` (the cache stays off, and the check names the word
    meant), never a directory; anything else is a directory (``./name`` for a bare name).
    """
    value = (raw or "").strip()
    lowered = value.lower()
    if lowered in ("", "auto"):
        return "auto"
    if lowered in ON_WORDS:
        return "on"
    if lowered in OFF_WORDS or lowered == "none":
        return "off"
    if near_word(lowered, ON_WORDS | OFF_WORDS | set(_WORDS)):
        return "invalid"
    return value


def check_environment(environ: Mapping[str, str]) -> list[str]:
    """The problem with :data:`CACHE_ENV`: a near miss of a word (``of``), which must not become a directory."""
    raw = environ.get(CACHE_ENV, "").strip()
    if parse_setting(raw) != "invalid":
        return []
    meant = near_word(raw, ON_WORDS | OFF_WORDS | set(_WORDS))
    return [
        f"{CACHE_ENV}={raw!r} is not a word the setting takes (did you mean {meant}?) and is not taken for a "
        f"directory: the persistent compile cache stays off; use auto, on, off, or a path such as ./{raw}"
    ]


def hf_home(environ: Mapping[str, str], home: str) -> str:
    """The Hugging Face cache directory, as ``huggingface_hub`` computes it (``HF_HOME``, else
    ``$XDG_CACHE_HOME/huggingface``, else ``~/.cache/huggingface``); ``home`` is the user's home."""
    default = os.path.join(environ.get("XDG_CACHE_HOME") or os.path.join(home, ".cache"), "huggingface")
    value = environ.get("HF_HOME") or default
    if value.startswith("~"):
        value = home + value[1:]
    return value


def default_root(environ: Mapping[str, str], home: str, torch_tpu_version: str | None) -> str:
    """``<HF_HOME>/transformers-tpu-ext/compile-cache/torch_tpu-<version>`` (``other-backend`` without torch_tpu)."""
    backend = f"torch_tpu-{torch_tpu_version}" if torch_tpu_version else "other-backend"
    return os.path.join(hf_home(environ, home), "transformers-tpu-ext", "compile-cache", backend)


def _is_remote(path: str) -> bool:
    return "://" in path  # gs://bucket/dir: torch_tpu writes it through tsl::Env; not checkable here


@dataclass(frozen=True)
class Facts:
    """What the caller found out, without asking torch_tpu anything that could start the chip.

    - ``torch_tpu_version``: the installed torch_tpu distribution, or None;
    - ``tpu_on_host``: a TPU chip on this host's PCI bus;
    - ``compiled_already``: the TPU backend looked up programs in this process already;
    - ``home``: the user's home directory; ``cwd``: the working directory (relative roots).
    """

    torch_tpu_version: str | None
    tpu_on_host: bool
    compiled_already: bool = False
    home: str = "~"
    cwd: str = "/"


@dataclass(frozen=True)
class CachePlan:
    """``action`` is ``"set"``, ``"leave"`` or ``"off"``; ``case`` names the rule that decided (one of
    :data:`CASES`); ``root`` the directory set (or the user's, for ``leave``); ``explicit`` when the user
    asked for the cache (``=on`` or a directory), so a refusal deserves a warning, not an info line."""

    action: str
    case: str
    root: str | None
    reason: str
    explicit: bool = False


#: Every rule of :func:`plan`, in the order it applies: case -> (action, when).
CASES: dict[str, tuple[str, str]] = {
    "user": ("leave", "a torch_tpu cache variable is set (`TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT`, `TORCH_TPU_TIER2_COMPILATION_CACHE`, or their `INTERNAL` names)"),
    "disabled": ("off", "`TRANSFORMERS_TPU_EXT_COMPILE_CACHE=off`"),
    "invalid": ("off", "a near miss of a word (`of`, `disbale`): reported, never taken for a directory"),
    "no_tpu": ("off", "by default, when no TPU chip is on the host's PCI bus (the simulated TPU included)"),
    "no_torch_tpu": ("off", "by default, when torch_tpu is not installed"),
    "late": ("off", "the TPU backend compiled in this process before the plugin was activated"),
    "read_only": ("off", "the directory cannot be created or written"),
    "default": ("set", "by default (a TPU chip and torch_tpu): `<HF_HOME>/transformers-tpu-ext/compile-cache/torch_tpu-<version>`"),
    "on": ("set", "`TRANSFORMERS_TPU_EXT_COMPILE_CACHE=on`: the same directory, whatever the backend"),
    "directory": ("set", "`TRANSFORMERS_TPU_EXT_COMPILE_CACHE=<directory>`: that directory"),
}


def plan(
    environ: Mapping[str, str],
    facts: Facts,
    writable: Callable[[str], bool],
) -> CachePlan:
    """What to do with torch_tpu's cache variables; ``writable(path)`` tells whether a directory
    can be created or written there."""
    for name in TORCH_TPU_CACHE_VARIABLES:
        value = environ.get(name, "")
        if value.strip():
            return CachePlan("leave", "user", environ.get(ROOT_ENV) or environ.get(TORCH_TPU_CACHE_VARIABLES[1]) or None,
                             f"{name}={value!r} is set: torch_tpu's cache settings are left as they are")
    raw = environ.get(CACHE_ENV, "")
    setting = parse_setting(raw)
    if setting == "invalid":
        return CachePlan("off", "invalid", None, check_environment(environ)[0])
    if setting == "off":
        return CachePlan("off", "disabled", None, f"{CACHE_ENV}={raw.strip()!r}: compiled programs are not kept across processes")
    explicit = setting != "auto"
    if setting == "auto":
        if not facts.tpu_on_host:
            return CachePlan("off", "no_tpu", None, f"no TPU chip on this host ({CACHE_ENV}=on keeps the programs of another "
                                          "TPU backend, such as the simulated TPU)")
        if not facts.torch_tpu_version:
            return CachePlan("off", "no_torch_tpu", None, f"torch_tpu is not installed ({CACHE_ENV}=on keeps the programs of another "
                                          "TPU backend)")
    if setting in ("auto", "on"):
        root = default_root(environ, facts.home, facts.torch_tpu_version)
    else:
        root = setting if _is_remote(setting) else os.path.normpath(os.path.join(facts.cwd, _expand(setting, facts.home)))
    if facts.compiled_already:
        return CachePlan(
            "off", "late", None,
            "the TPU backend compiled programs in this process before transformers-tpu-ext was activated, so it "
            f"has read its cache settings already: import transformers_tpu_ext (or let `import torch` load it) "
            f"before the first TPU operation, or set {ROOT_ENV} yourself",
            explicit,
        )
    if not _is_remote(root) and not writable(root):
        return CachePlan(
            "off", "read_only", None,
            f"{root} cannot be created or written (read-only file system or no permission), and torch_tpu would "
            f"abort at its first compilation: set {CACHE_ENV} to a writable directory, or to off",
            explicit,
        )
    case = {"auto": "default", "on": "on"}.get(setting, "directory")
    return CachePlan("set", case, root, f"compiled programs are kept in {root}", explicit)


def _expand(path: str, home: str) -> str:
    return home + path[1:] if path.startswith("~") else path

