"""Rewrite the generated tables of the docs from the policies that make the decisions.

    python scripts/gen_docs_tables.py           # rewrite in place
    python scripts/gen_docs_tables.py --check   # exit 1 if a table is out of date

Today: docs/generation.md, "Which path a call takes" (``transformers_tpu_ext.generation.paths``),
"Models whose rotary embedding reads the length" (``transformers_tpu_ext.core.length_readers.length_table``),
"Vision-language, speech and encoder-decoder models" (``transformers_tpu_ext.generation.families``) and
"State-space and hybrid models" (``transformers_tpu_ext.generation.recurrent.family_table``),
docs/serving.md, "The attention kernel" (``transformers_tpu_ext.serving.kernel_path``) and "Sampling
parameters per request" (``transformers_tpu_ext.serving.sampling``), and docs/configuration.md, "Every
setting" (``transformers_tpu_ext.settings.settings_table``), and docs/doctor.md, "Hub kernels on TPU"
(``transformers_tpu_ext.kernels.policy.path_table``), each between
its ``<!-- generated: ... -->`` and ``<!-- end of generated table -->`` markers.
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
    from transformers_tpu_ext import settings
    from transformers_tpu_ext.core import length_readers
    from transformers_tpu_ext.generation import families, paths, recurrent
    from transformers_tpu_ext.kernels import policy as kernels_policy
    from transformers_tpu_ext.serving import kernel_path, sampling
    from transformers_tpu_ext.serving import tensor_parallel

    tables = (
        ("generation.md", paths.BEGIN, paths.END, paths.path_table),
        ("generation.md", length_readers.BEGIN, length_readers.END, length_readers.length_table),
        ("generation.md", families.BEGIN, families.END, families.family_table),
        ("generation.md", recurrent.BEGIN, recurrent.END, recurrent.family_table),
        ("serving.md", kernel_path.BEGIN, kernel_path.END, kernel_path.path_table),
        ("serving.md", sampling.BEGIN, sampling.END, sampling.path_table),
        ("serving.md", tensor_parallel.BEGIN, tensor_parallel.END, tensor_parallel.path_table),
        ("configuration.md", settings.BEGIN, settings.END, settings.settings_table),
        ("doctor.md", kernels_policy.BEGIN, kernels_policy.END, kernels_policy.path_table),
    )
    status = 0
    for name in dict.fromkeys(name for name, *_ in tables):
        page = ROOT / "docs" / name
        text = updated = page.read_text()
        for _, begin_mark, end_mark, table in (t for t in tables if t[0] == name):
            begin = updated.index(begin_mark) + len(begin_mark)
            end = updated.index(end_mark, begin)
            updated = updated[:begin] + "\n" + table() + "\n" + updated[end:]
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
