"""docs/inference.md's table of which calls are padded is the predicate's own answer."""

from __future__ import annotations

from pathlib import Path

from transformers_tpu_ext.inference import paths, policy

DOCS = Path(__file__).resolve().parents[2] / "docs" / "inference.md"


def test_the_table_in_docs_inference_md_is_rendered_from_the_predicate():
    text = DOCS.read_text()
    assert "<!-- generated: inference-calls" in text
    assert paths.render(text) == text, "run: python -m transformers_tpu_ext.inference.paths docs/inference.md"


def test_a_changed_decision_changes_the_page(monkeypatch):
    text = DOCS.read_text()
    monkeypatch.setattr(policy, "SAFE_ROPE", frozenset({None, "default", "linear", "dynamic"}))
    assert paths.render(text) != text


def test_every_case_is_decided_by_the_predicate():
    cells = [row.split(" | ")[1] for row in paths.call_table().splitlines()[2:]]
    assert len(cells) == len(paths.CASES)
    assert {cell.startswith("padded to ") or cell == "as it is" for cell in cells} == {True}
    assert sum(cell.startswith("padded to ") for cell in cells) == 8
