"""Rewrite the generated tables of the docs from the policies that make the decisions.

    python scripts/gen_docs_tables.py           # rewrite in place
    python scripts/gen_docs_tables.py --check   # exit 1 if a table is out of date

Today: docs/generation.md, "Which path a call takes" (``transformers_tpu_ext.generation.paths``), and
docs/serving.md, "The attention kernel" (``transformers_tpu_ext.serving.kernel_path``), each between its
``<!-- generated: ... -->`` and ``<!-- end of generated table -->`` markers.
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
    from transformers_tpu_ext.serving import kernel_path

    status = 0
    for name, module in (("generation.md", paths), ("serving.md", kernel_path)):
        page = ROOT / "docs" / name
        text = page.read_text()
        begin, end = text.index(module.BEGIN) + len(module.BEGIN), text.index(module.END, text.index(module.BEGIN))
        updated = text[:begin] + "\n" + module.path_table() + "\n" + text[end:]
        if updated == text:
            continue
        if args.check:
            print(f"{page.relative_to(ROOT)}: the generated table is out of date (python scripts/gen_docs_tables.py)")
            status = 1
            continue
        page.write_text(updated)
        print(f"rewrote the generated table of {page.relative_to(ROOT)}")
    return status


if __name__ == "__main__":
    raise SystemExit(main())
