"""The one parser of every ``TRANSFORMERS_TPU_EXT_*`` variable: the :class:`Setting` a capability declares,
the one vocabulary of on/off words, and :func:`parse`.

The lowest layer of the settings: it imports nothing of the package (every capability's ``settings``
module imports it; ``transformers_tpu_ext.settings`` collects and checks them). Pure: no torch.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

__all__ = ["NEAR", "OFF_WORDS", "ON_WORDS", "PREFIX", "SWITCH_HELP", "Setting", "near_word", "parse", "switch"]

PREFIX = "TRANSFORMERS_TPU_EXT_"
#: The one vocabulary of every switch (and of the on/off words of the settings that take more).
ON_WORDS = frozenset({"1", "on", "true", "yes", "enable", "enabled"})
OFF_WORDS = frozenset({"0", "off", "false", "no", "disable", "disabled"})
SWITCH_HELP = "use 1 or 0 (or on/off, true/false, yes/no, enable(d)/disable(d))"
#: How close a word must be to a vocabulary word to be taken for a typo of it (``difflib`` ratio).
NEAR = 0.6


@dataclass(frozen=True)
class Setting:
    """One ``TRANSFORMERS_TPU_EXT_*`` variable, as its capability declares it.

    ``kind``: ``switch`` (a bool), ``integer``, ``integers`` (a comma list), ``number`` (a float),
    ``choice`` (one of ``choices``, any case), or ``text`` (parsed by its capability: a size, a spec, a
    directory). ``none_words``: values meaning ``None`` (the default). ``field``: the name of the
    capability's settings field (``configure(field=...)``) when it has one. ``default`` and ``values``
    are what the docs' table shows (Markdown).
    """

    name: str
    kind: str
    default: str
    doc: str
    values: str = ""
    choices: tuple[str, ...] = ()
    none_words: tuple[str, ...] = ()
    field: str = ""

    def shown_values(self) -> str:
        if self.values:
            return self.values
        if self.kind == "switch":
            return "`1`, `0`"
        if self.kind == "choice":
            return ", ".join(f"`{choice}`" for choice in self.choices)
        return {"integer": "integer", "integers": "comma list of integers", "number": "number"}.get(self.kind, "text")


def near_word(raw: str, words: Iterable[str] = ON_WORDS | OFF_WORDS) -> str | None:
    """The vocabulary word ``raw`` is a near miss of (``of`` -> ``off``), or ``None`` (an exact word too)."""
    lowered = raw.strip().lower()
    words = sorted(words)
    if not lowered or lowered in words or not lowered.isalpha():
        return None
    close = difflib.get_close_matches(lowered, [w for w in words if w.isalpha()], n=1, cutoff=NEAR)
    return close[0] if close else None


def switch(name: str, raw: str) -> bool:
    """``True``/``False`` from the one vocabulary; ``ValueError`` naming ``name`` otherwise."""
    lowered = raw.strip().lower()
    if lowered in ON_WORDS:
        return True
    if lowered in OFF_WORDS:
        return False
    meant = near_word(lowered)
    hint = f" (did you mean {meant}?)" if meant else ""
    raise ValueError(f"{name}={raw.strip()!r}{hint}: {SWITCH_HELP}")


def parse(setting: Setting, raw: str) -> Any:
    """The value of ``raw`` for ``setting`` by its kind (``text`` comes back stripped). ``ValueError``
    names the variable and what it takes."""
    raw = raw.strip()
    where = f"{setting.name}={raw!r}"
    if raw.lower() in setting.none_words:
        return None
    if setting.kind == "switch":
        return switch(setting.name, raw)
    if setting.kind == "choice":
        lowered = raw.lower()
        if lowered in setting.choices:
            return lowered
        close = difflib.get_close_matches(lowered, setting.choices, n=1, cutoff=NEAR)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise ValueError(f"{where}{hint}: use one of {', '.join(setting.choices)}")
    try:
        if setting.kind == "integers":
            return tuple(int(part) for part in raw.replace(" ", "").split(",") if part)
        if setting.kind == "integer":
            return int(raw)
        if setting.kind == "number":
            return float(raw)
    except ValueError:
        kind = {"integers": "a comma list of integers", "integer": "an integer", "number": "a number"}[setting.kind]
        raise ValueError(f"{where}: expected {kind}") from None
    return raw
