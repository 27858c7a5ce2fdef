"""The simulated TPU's compile cache: torch_tpu 0.2.0's in-memory and persistent tiers, cache-only mode.

What torch_tpu does (``shared/reference`` Q4 "Compile caches" and "Recompile detection"; the layout and
the failure modes from torch_tpu's public source mirror):

- **Tier 1, in memory.** Every program a process runs is looked up: a *request*; found in memory, a
  *hit*; otherwise a *miss*, and the process gets the program from the persistent tier or compiles it.
  ``torch.tpu._get_cache_requests()``, ``_get_cache_hits()``, ``_get_cache_misses()`` count them.
- **Tier 3, persistent.** ``TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT`` (``TORCH_TPU_INTERNAL_...`` in
  older builds), read **once**, at the process's first lookup. An entry is
  ``<root>/<fingerprint>/<key>.bin``, the fingerprint made from torch_tpu's and PJRT's versions, so
  another release never reads it. Entries are written atomically (a uniquely named temporary file,
  then a rename; the last writer wins), so processes sharing a root never read half an entry. A root
  whose directory cannot be created aborts the process at its first lookup (an ``ABSL_CHECK``).
- **Cache-only mode.** ``torch.tpu._set_cache_only(True)``: any tier-1 miss raises, even one the
  persistent tier holds ("no more compilation should happen; yet compilation is needed").

A miss the persistent tier serves is *loaded*: it adds to ``Counters.programs_loaded``, not to
``graphs_compiled`` / ``eager_programs``, which count what the process compiled.

Not modelled: tier 2 (``/dev/shm/torch_tpu_cache/<name>``, shared by the processes of one host, on by
default at world size > 1 or with tier 3): simulated ranks compile each on their own, or share a
tier-3 root. ``_clear_cache()`` (in ``tpu_module``) forgets eager programs only (TorchDynamo keeps
the compiled graphs).
"""

from __future__ import annotations

import hashlib
import itertools
import os
import sys
import threading
from collections.abc import Mapping
from typing import Any

__all__ = [
    "CACHE",
    "CACHE_ONLY_ERROR",
    "ROOT_ENV",
    "ROOT_ENV_INTERNAL",
    "SimulatedCompileCache",
    "TORCH_TPU_VERSION",
]

#: torch_tpu's persistent cache root (0.2.0), and the name older builds read.
ROOT_ENV = "TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT"
ROOT_ENV_INTERNAL = "TORCH_TPU_INTERNAL_TIER3_COMPILATION_CACHE_ROOT"
#: The release the simulated TPU stands for (entries are keyed by it).
TORCH_TPU_VERSION = "0.2.0"
CACHE_ONLY_ERROR = "The user has asserted that no more compilation should happen; yet compilation is needed for key: "

_UNREAD = object()
_tmp_counter = itertools.count()


class SimulatedCompileCache:
    """The process's compile cache. ``environ`` (default ``os.environ``) is read at the first lookup."""

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        self._environ = environ
        self._lock = threading.Lock()
        self._root: Any = _UNREAD
        #: the torch_tpu release this process runs (entries of another release are never read)
        self.version = TORCH_TPU_VERSION
        self.cache_only = False
        self.dump_on_miss = False
        self.reset_stats()

    # -- statistics ----------------------------------------------------------------------------
    def reset_stats(self) -> None:
        """Zero the statistics (``SimulatedTPU.reset_counters()`` calls it); the caches stay."""
        #: tier-1 hits (a program found in memory); kept cheap: incremented on every reuse
        self.hits = 0
        self.misses = 0
        #: misses served by the persistent tier / compiled
        self.loaded = 0
        self.compiled = 0
        #: one ``(kind, source, key)`` per miss: ``source`` is "compiled" or "tier-3"
        self.entries: list[tuple[str, str, str]] = []

    @property
    def requests(self) -> int:
        return self.hits + self.misses

    def stats(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "hits": self.hits,
            "misses": self.misses,
            "compiled": self.compiled,
            "loaded": self.loaded,
            "root": self.root(),
            "entries": [{"kind": k, "source": s, "key": key} for k, s, key in self.entries],
        }

    # -- the persistent tier -------------------------------------------------------------------
    def root(self) -> str | None:
        """The tier-3 root of this process, read from the environment once (as torch_tpu does)."""
        if self._root is _UNREAD:
            environ = os.environ if self._environ is None else self._environ
            value = environ.get(ROOT_ENV) or environ.get(ROOT_ENV_INTERNAL) or None
            self._root = value
        return self._root

    def fingerprint(self) -> str:
        return hashlib.sha256(f"simulated torch_tpu {self.version}".encode()).hexdigest()[:16]

    def directory(self) -> str | None:
        """``<root>/<fingerprint>``: where this release's entries live (None without a root)."""
        root = self.root()
        return None if root is None else os.path.join(root, self.fingerprint())

    def _entry_path(self, key: str) -> str:
        directory = self.directory()
        assert directory is not None
        try:
            os.makedirs(directory, exist_ok=True)
        except OSError as error:  # torch_tpu: ABSL_CHECK(status.ok()) in EnsureTier3CacheDirExistsOnceOrDie
            sys.stderr.write(
                f"F0000 tier3_compilation_cache.cc] Check failed: status.ok() Failed to create tier-3 cache "
                f"directory: {directory} with error: {error}\n"
            )
            sys.stderr.flush()
            os.abort()
        return os.path.join(directory, hashlib.sha256(key.encode()).hexdigest()[:40] + ".bin")

    def _write(self, path: str, key: str) -> None:
        temporary = f"{path}.{os.getpid()}-{threading.get_ident()}-{next(_tmp_counter)}.tmp"
        try:
            with open(temporary, "w", encoding="utf-8") as file:
                file.write(key)
            os.replace(temporary, path)  # atomic: a reader sees no entry or a whole one
        except OSError as error:  # torch_tpu logs the failed write and goes on
            sys.stderr.write(f"E0000 tier2_compilation_cache.cc] Failed to write cache file {path}: {error}\n")
            try:
                os.unlink(temporary)
            except OSError:
                pass

    # -- a lookup that missed tier 1 ----------------------------------------------------------
    def miss(self, kind: str, key: Any) -> bool:
        """A program the process does not hold: ``True`` when it must be compiled, ``False`` when
        the persistent tier served it. Raises torch_tpu's error in cache-only mode."""
        text = key() if callable(key) else f"{kind} {key!r}"
        with self._lock:
            self.misses += 1
            if self.cache_only:
                raise RuntimeError(CACHE_ONLY_ERROR + text)
            if self.dump_on_miss:
                sys.stderr.write(f"Dumping StableHLO module due to cache miss for key: {text}\n")
            if self.root() is not None:
                path = self._entry_path(text)
                if os.path.isfile(path):
                    self.loaded += 1
                    self.entries.append((kind, "tier-3", text))
                    return False
                self._write(path, text)
            self.compiled += 1
            self.entries.append((kind, "compiled", text))
            return True


#: The process's cache (the dispatcher and the compile backend report to it).
CACHE = SimulatedCompileCache()


# ---------------------------------------------------------------------------------------------
# torch_tpu's private ``torch.tpu._*`` functions of the cache (``tpu_module`` exports them).


def _get_cache_requests() -> int:
    return CACHE.requests


def _get_cache_hits() -> int:
    return CACHE.hits


def _get_cache_misses() -> int:
    return CACHE.misses


def _get_cache_stats() -> dict[str, Any]:
    return CACHE.stats()


def _set_cache_only(cache_only: bool = True) -> None:  # torch_tpu's parameter names (tests/simulator/test_surface_wheel.py)
    CACHE.cache_only = bool(cache_only)


def _set_dump_on_cache_miss(enable: bool = True) -> None:
    CACHE.dump_on_miss = bool(enable)

