"""``BucketCollator`` and the batch it returns: a ``PaddedBatch`` that knows what it was, through
everything a data loader and Accelerate do to a batch; batches left alone are said once in the log."""

from __future__ import annotations

import copy
import logging
import pickle

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from transformers_tpu_ext.training import BucketCollator, PaddedBatch, original_of  # noqa: E402
from transformers_tpu_ext.training import buckets, collator as collator_module  # noqa: E402
from transformers_tpu_ext.training.collator import crop  # noqa: E402


def _batch(rows=3, length=20):
    ids = torch.arange(rows * length).reshape(rows, length) % 50 + 2
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}


def test_a_padded_batch_knows_what_it_was_through_moves_copies_and_pickling(simulated_tpu):
    padded = BucketCollator(lambda f: _batch(), batch_size=4, model=buckets.ModelFacts())(None)
    assert isinstance(padded, PaddedBatch) and padded["input_ids"].shape == (4, 32)
    expected = {"rows": 3, "lengths": {"input_ids": 20, "attention_mask": 20, "labels": 20}, "added_mask": False,
                "cut": ((32, 20),), "buckets": (32,)}
    assert original_of(padded) == expected
    moved = padded.to("tpu", non_blocking=True)  # Accelerate's send_to_device calls a mapping's own .to()
    assert moved["input_ids"].device.type == "tpu" and original_of(moved) == expected
    assert original_of(copy.copy(padded)) == original_of(copy.deepcopy(padded)) == expected  # pin_memory copies
    assert original_of(pickle.loads(pickle.dumps(padded))) == expected  # data-loader workers
    assert original_of(type(padded)({k: v for k, v in padded.items()})) is None  # rebuilt: knows nothing
    assert padded.input_ids is padded["input_ids"]  # keys read as attributes, as on a BatchEncoding
    loader = torch.utils.data.DataLoader([0] * 3, batch_size=3, pin_memory=True,
                                         collate_fn=BucketCollator(lambda f: _batch(), batch_size=4))
    assert original_of(next(iter(loader))) == expected


def test_crop_gives_back_the_collators_batch():
    blocks = {"input_ids": torch.ones(3, 100, dtype=torch.long), "labels": torch.ones(3, 100, dtype=torch.long)}
    padded = BucketCollator(lambda f: blocks, batch_size=4, model=buckets.ModelFacts(causal=False))(None)
    assert padded["attention_mask"].shape == (4, 128) and padded["attention_mask"][:3, 100:].eq(0).all()
    assert padded["attention_mask"][:3, :100].eq(1).all() and padded["labels"][3].eq(-100).all()
    cropped = crop(padded, original_of(padded))
    assert set(cropped) == {"input_ids", "labels"}  # the mask was the plugin's
    assert all(torch.equal(cropped[k], blocks[k]) for k in blocks)


def test_a_batch_left_alone_is_said_once(caplog, monkeypatch):
    monkeypatch.setattr(collator_module, "_told", set())
    classifier = buckets.ModelFacts(per_token_labels=False, pools_last_token=True)  # no pad token
    make = lambda f: {"input_ids": torch.ones(1, 20, dtype=torch.long), "labels": torch.zeros(1, dtype=torch.long)}  # noqa: E731
    with caplog.at_level(logging.WARNING, logger="transformers_tpu_ext"):
        for _ in range(3):
            batch = BucketCollator(make, batch_size=4, model=classifier)(None)
            assert not isinstance(batch, PaddedBatch) and batch["input_ids"].shape == (1, 20)
    said = [r.getMessage() for r in caplog.records if "pad_token_id" in r.getMessage()]
    assert len(said) == 1 and "left as the collator made them" in said[0]


def test_a_collator_given_a_model_pads_as_the_model_needs():
    from transformers_tpu_ext.testing.tiny import tiny_config

    from transformers import AutoModelForSequenceClassification

    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_config(tiny_config("qwen3", num_labels=3, pad_token_id=7))
    make = lambda f: {"input_ids": torch.ones(2, 20, dtype=torch.long), "labels": torch.tensor([0, 2])}  # noqa: E731
    padded = BucketCollator(make, batch_size=2, pad_token_id=0, model=model)(None)
    assert padded["input_ids"].shape == (2, 32) and padded["input_ids"][:, 20:].eq(7).all()  # the config's pad id
    assert padded["labels"].shape == (2,)
