"""docs/training.md's tables of what is padded, adapted or left alone are the predicates' own answers."""

from __future__ import annotations

from pathlib import Path

from transformers_tpu_ext.training import buckets, paths, policy

DOCS = Path(__file__).resolve().parents[2] / "docs" / "training.md"


def test_the_tables_in_docs_training_md_are_rendered_from_the_predicates():
    text = DOCS.read_text()
    assert "<!-- generated: training-batches" in text and "<!-- generated: training-optimizers" in text
    assert paths.render(text) == text, "run: python -m transformers_tpu_ext.training.paths docs/training.md"


def test_a_changed_decision_changes_the_page(monkeypatch):
    text = DOCS.read_text()
    monkeypatch.setattr(policy, "EXACT_OPTIMIZERS", ())
    assert paths.render(text) != text
    monkeypatch.undo()
    monkeypatch.setattr(buckets, "PACKED_KEYS", ("input_ids",))
    assert paths.render(text) != text


def test_every_case_of_the_tables_is_decided_by_the_predicates():
    cells = [row.split(" | ")[2] for row in paths.batch_table().splitlines()[2:]]
    assert len(cells) == len(paths.BATCH_CASES)
    left = [cell for cell in cells if cell == "left as the collator made it"]
    padded = [cell for cell in cells if cell.startswith("padded to ")]
    assert len(left) + len(padded) == len(cells) and left and padded
    adapted = [row for row in paths.optimizer_table().splitlines()[2:] if "device tensor learning rate" in row]
    assert len(adapted) == 2  # fused, and the foreach default: Adam/AdamW only
