"""Numbers a page quotes from the benchmarks are the benchmarks' (benchmarks/README.md has the run)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _row(table_text: str, label: str) -> list[str]:
    for line in table_text.splitlines():
        if line.startswith(f"| {label}"):
            return [cell.strip() for cell in line.strip().strip("|").split("|")]
    raise AssertionError(f"no row {label!r}")


def test_generation_quotes_the_guide_decode_bytes_of_the_benchmark():
    # docs/generation.md said "about 33-150 bytes" where the benchmark measured 49-56.
    bench = (ROOT / "benchmarks" / "README.md").read_text()
    guide = _row(bench, "`decode_bytes`, inputs on the CPU")[2]  # the `guide` column: "to host / to TPU"
    to_host, to_tpu = (part.strip() for part in guide.split("/"))
    page = " ".join((ROOT / "docs" / "generation.md").read_text().split())
    assert re.search(rf"against {re.escape(to_host)} and {re.escape(to_tpu)} bytes with the guide's recipe", page), (to_host, to_tpu)
