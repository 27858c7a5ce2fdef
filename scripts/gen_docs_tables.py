"""Rewrite the generated tables of the docs from the policies that make the decisions.

    python scripts/gen_docs_tables.py           # rewrite in place
    python scripts/gen_docs_tables.py --check   # exit 1 if a table is out of date

Today: docs/generation.md, "Which path a call takes" (``transformers_tpu_ext.generation.paths``),
between its ``<!-- generated: ... -->`` and ``<!-- end of generated table -->`` markers, and its
"Models whose rotary embedding reads the length" (``transformers_tpu_ext.length_readers.length_table``).
``tests/generation/test_generation_paths_table.py`` fails when the docs and the policy differ.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only check; exit 1 if a table is out of date")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from transformers_tpu_ext.generation import paths

    page = ROOT / "docs" / "generation.md"
    text = page.read_text()
    begin, end = text.index(paths.BEGIN) + len(paths.BEGIN), text.index(paths.END)
    updated = text[:begin] + "\n" + paths.path_table() + "\n" + text[end:]
    from transformers_tpu_ext import length_readers

    begin, end = updated.index(length_readers.BEGIN) + len(length_readers.BEGIN), updated.index(length_readers.END)
    updated = updated[:begin] + "\n" + length_readers.length_table() + "\n" + updated[end:]
    if updated == text:
        return 0
    if args.check:
        print(f"{page.relative_to(ROOT)}: the generated table is out of date (python scripts/gen_docs_tables.py)")
        return 1
    page.write_text(updated)
    print(f"rewrote the generated table of {page.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
