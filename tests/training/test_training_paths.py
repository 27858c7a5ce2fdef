"""Issue 19, items 2-8, 11 (encoder-decoder labels, include_num_input_tokens_seen) and 13 (2-D features):
what the Trainer's batches look like on TPU next to the paths test_training.py covers.

Each test runs the same script twice: on plain CPU with every patch of the plugin off, and on the
simulated TPU with the plugin; both must agree. Models are tiny and context-sensitive (attending to a
padding position, or pooling one, changes the loss).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import _paths  # noqa: E402
import _training  # noqa: E402
from _paths import TOLERANCE, both, losses, max_diff  # noqa: E402
from _training import requires_trainer  # noqa: E402

pytestmark = requires_trainer


def _tag(cpu: bool) -> str:
    return "cpu" if cpu else "tpu"


# -- item 2: packed sequences (DataCollatorWithFlattening) --------------------------------------------


def test_packed_sequences_do_not_attend_across_each_other(simulated_tpu, tmp_path):
    """Item 2: `DataCollatorWithFlattening` packs a batch into one row with position ids and no mask;
    Transformers then keeps each sequence to itself. Before the fix, the plugin added an all-ones attention_mask
    (which turned that detection off) and padded the single row to 4 rows."""
    from transformers import DataCollatorWithFlattening

    data = [{"input_ids": ids} for ids in _paths.token_lists(24, 8, 40)]

    def run(cpu: bool):
        trainer = _paths.trainer(tmp_path / _tag(cpu), cpu=cpu, model=_paths.causal_lm("qwen3"), train=data,
                                 collator=DataCollatorWithFlattening())
        trainer.train()
        return losses(trainer)

    cpu, tpu = both(run)
    assert max_diff(tpu, cpu) < TOLERANCE, (tpu, cpu)


# -- item 3: an attention mask the plugin adds -------------------------------------------------------


def test_mlm_on_fixed_blocks_without_a_mask_does_not_attend_to_bucket_padding(simulated_tpu, tmp_path):
    """Item 3: BERT MLM with `default_data_collator` on fixed 100-token blocks (no attention_mask in the
    batch): the 28 positions the plugin pads to the 128 bucket must be masked. Before the fix, the mask it added
    covered the 100 real tokens only, and BERT attended to the padding."""
    data = _paths.mlm_blocks(24, 100)

    def run(cpu: bool):
        trainer = _paths.trainer(tmp_path / _tag(cpu), cpu=cpu, model=_paths.bert_mlm(), train=data)
        trainer.train()
        return losses(trainer)

    cpu, tpu = both(run)
    assert max_diff(tpu, cpu) < TOLERANCE, (tpu, cpu)


# -- item 4: multi-label classification -----------------------------------------------------------------


def test_multi_label_classification_labels_are_not_per_token(simulated_tpu, tmp_path):
    """Item 4: `problem_type="multi_label_classification"`: float labels of shape (batch, num_labels).
    Before the fix, they were taken for per-token labels, padded to the sequence bucket, and step 1 crashed."""
    from transformers import DataCollatorWithPadding

    gen = torch.Generator().manual_seed(0)
    data = [
        {"input_ids": ids, "labels": (torch.rand(3, generator=gen) < 0.5).float().tolist()}
        for ids in _paths.token_lists(24, 8, 40)
    ]

    def run(cpu: bool):
        model = _paths.classifier(num_labels=3, problem_type="multi_label_classification")
        trainer = _paths.trainer(tmp_path / _tag(cpu), cpu=cpu, model=model, train=data,
                                 collator=DataCollatorWithPadding(_paths.tokenizer("right")))
        trainer.train()
        return losses(trainer)

    cpu, tpu = both(run)
    assert max_diff(tpu, cpu) < TOLERANCE, (tpu, cpu)


# -- item 5: generative evaluation of a decoder-only model ---------------------------------------------


@pytest.mark.slow  # generate() compiles its prefill and decode programs on the simulator (~20 s)
def test_predict_with_generate_keeps_left_padding(simulated_tpu, tmp_path):
    """Item 5: `Seq2SeqTrainer(predict_with_generate=True)` on a decoder-only model whose tokenizer pads
    on the left: generation continues each prompt. Before the fix, the evaluation batch was padded on the right
    to its bucket, so `generate()` continues after padding and every continuation changes."""
    from transformers import DataCollatorWithPadding, Seq2SeqTrainer, Seq2SeqTrainingArguments

    prompts = [{"input_ids": ids} for ids in _paths.token_lists(6, 5, 20, seed=7)]
    new = 5

    def run(cpu: bool):
        tok = _paths.tokenizer("left")
        trainer = _paths.trainer(
            tmp_path / _tag(cpu), cpu=cpu, model=_paths.causal_lm("qwen3"), collator=DataCollatorWithPadding(tok),
            trainer_class=Seq2SeqTrainer, args_class=Seq2SeqTrainingArguments, processing_class=tok,
            predict_with_generate=True, generation_max_length=None,
        )
        out = trainer.predict(prompts, max_new_tokens=new, min_new_tokens=new, do_sample=False)
        return out.predictions

    cpu, tpu = both(run)
    # the continuations: the last `new` tokens of every row (left padding puts them at the end)
    assert tpu[:, -new:].tolist() == cpu[:, -new:].tolist()


# -- item 6: a sequence classifier without a pad token -------------------------------------------------


def test_sequence_classifier_without_pad_token_pools_the_last_real_token(simulated_tpu, tmp_path):
    """Item 6: with no pad token (allowed upstream at batch size 1) the classifier pools the last
    position. Before the fix, the plugin padded the row to its bucket, and the pooled position was padding."""
    data = [{"input_ids": ids, "labels": i % 3} for i, ids in enumerate(_paths.token_lists(8, 8, 40))]

    def run(cpu: bool):
        model = _paths.classifier(num_labels=3, pad_token_id=None)
        trainer = _paths.trainer(tmp_path / _tag(cpu), cpu=cpu, model=model, train=data,
                                 per_device_train_batch_size=1)
        trainer.train()
        return losses(trainer)

    cpu, tpu = both(run)
    assert max_diff(tpu, cpu) < TOLERANCE, (tpu, cpu)


# -- item 7: predict() / evaluate() shapes --------------------------------------------------------------


def test_predict_returns_the_shapes_of_a_cpu_run(simulated_tpu, tmp_path):
    """Item 7: `predict()` on a causal LM: (7, 33, 320) as on CPU (batches padded across with -100).
    Before the fix: (7, 48, 320), the extra positions holding logits of padding."""
    lengths = [33, 12, 20, 9, 30, 17, 25]
    ids = _paths.token_lists(7, 8, 33, seed=4)
    data = [{"input_ids": (row * 4)[:n]} for row, n in zip(ids, lengths)]

    def run(cpu: bool):
        trainer = _paths.trainer(tmp_path / _tag(cpu), cpu=cpu, model=_paths.causal_lm("qwen3"),
                                 collator=_training.collator())
        out = trainer.predict(data)
        return out.predictions, out.label_ids, out.metrics["test_loss"]

    (cpu_pred, cpu_labels, cpu_loss), (tpu_pred, tpu_labels, tpu_loss) = both(run)
    assert tpu_pred.shape == cpu_pred.shape == (7, 33, _paths.VOCAB), (tpu_pred.shape, cpu_pred.shape)
    assert (tpu_labels == cpu_labels).all()
    assert abs(tpu_loss - cpu_loss) < TOLERANCE
    assert abs(tpu_pred - cpu_pred).max() < TOLERANCE


def test_seq2seq_predict_label_ids_keep_their_length(simulated_tpu, tmp_path):
    """Item 7: T5 `predict()`: `label_ids` (5, 16) and predictions as on CPU. Before the fix, the labels came
    back padded to the encoder's bucket, (5, 64)."""
    from transformers import DataCollatorForSeq2Seq

    sources = _paths.token_lists(5, 40, 60, seed=5)
    targets = _paths.token_lists(5, 6, 16, seed=6)
    data = [{"input_ids": s, "labels": t} for s, t in zip(sources, targets)]
    data[0]["labels"] = (targets[0] * 4)[:16]

    def run(cpu: bool):
        model = _paths.t5()
        trainer = _paths.trainer(tmp_path / _tag(cpu), cpu=cpu, model=model,
                                 collator=DataCollatorForSeq2Seq(_paths.tokenizer("right"), model=model))
        out = trainer.predict(data)
        logits = out.predictions[0] if isinstance(out.predictions, tuple) else out.predictions
        return logits, out.label_ids, out.metrics["test_loss"]

    (cpu_pred, cpu_labels, cpu_loss), (tpu_pred, tpu_labels, tpu_loss) = both(run)
    assert tpu_labels.shape == cpu_labels.shape == (5, 16), (tpu_labels.shape, cpu_labels.shape)
    assert tpu_pred.shape == cpu_pred.shape, (tpu_pred.shape, cpu_pred.shape)
    assert abs(tpu_loss - cpu_loss) < TOLERANCE


# -- item 8: learned absolute positions, a maximum length that is not a bucket -------------------------


@pytest.mark.parametrize("kind", ["gpt2", "bert"])
def test_learned_positions_with_a_maximum_that_is_not_a_bucket(simulated_tpu, tmp_path, kind):
    """Item 8: GPT-2 with `n_positions=200`, BERT with `max_position_embeddings=200`, sequences of up to
    200 tokens: the bucket above 192 is 256, past the position table. Before the fix: IndexError."""
    if kind == "gpt2":
        make = lambda: _paths.causal_lm("gpt2", n_positions=200)  # noqa: E731
        data = [{"input_ids": ids} for ids in _paths.token_lists(16, 150, 200)]
        collator = _training.collator()
    else:
        make = lambda: _paths.bert_mlm(max_position_embeddings=200)  # noqa: E731
        data = _paths.mlm_blocks(16, 200)
        collator = None

    def run(cpu: bool):
        trainer = _paths.trainer(tmp_path / _tag(cpu), cpu=cpu, model=make(), train=data, collator=collator,
                                 max_steps=4)
        trainer.train()
        return losses(trainer)

    cpu, tpu = both(run)
    assert max_diff(tpu, cpu) < TOLERANCE, (tpu, cpu)


# -- item 11: encoder-decoder labels; include_num_input_tokens_seen -------------------------------------


def test_encoder_decoder_labels_are_padded_to_their_own_bucket(simulated_tpu, tmp_path):
    """Item 11: T5 with 90-100-token inputs and 5-12-token targets: `labels` / `decoder_input_ids` go to
    the decoder's bucket (16), not the encoder's (96/128: 8x the decoder's work). Losses as on CPU."""
    from transformers import DataCollatorForSeq2Seq

    sources = _paths.token_lists(24, 90, 100, seed=5)
    targets = _paths.token_lists(24, 5, 12, seed=6)
    data = [{"input_ids": s, "labels": t} for s, t in zip(sources, targets)]

    def run(cpu: bool):
        model = _paths.t5()
        trainer = _paths.trainer(tmp_path / _tag(cpu), cpu=cpu, model=model, train=data,
                                 collator=DataCollatorForSeq2Seq(_paths.tokenizer("right"), model=model))
        shapes = [(tuple(b["input_ids"].shape), tuple(b["labels"].shape)) for b in trainer.get_train_dataloader()]
        trainer.train()
        return losses(trainer), shapes

    (cpu, _), (tpu, shapes) = both(run)
    assert max_diff(tpu, cpu) < TOLERANCE, (tpu, cpu)
    assert max(labels[1] for _, labels in shapes) <= 16, shapes


@pytest.mark.parametrize("mode", ["all", "non_padding"])
def test_num_input_tokens_seen_counts_what_the_cpu_counts(simulated_tpu, tmp_path, mode):
    """Item 11: `include_num_input_tokens_seen` counts the collator's tokens as on CPU, not the bucket
    padding or the rows added to the partial last batch."""
    from transformers_tpu_ext.testing.tiny import tiny_lm_dataset

    data = tiny_lm_dataset(10)  # batches of 4, 4 and 2

    def run(cpu: bool):
        trainer = _paths.trainer(tmp_path / _tag(cpu), cpu=cpu, model=_paths.causal_lm("qwen3"), train=data,
                                 collator=_training.collator(), max_steps=-1, num_train_epochs=1,
                                 include_num_input_tokens_seen=mode)
        trainer.train()
        return trainer.state.num_input_tokens_seen

    cpu, tpu = both(run)
    assert tpu == cpu


# -- item 13: a 2-D feature input (Transformers' test_resume_from_interrupted_training) ----------------


def test_a_feature_vector_named_input_ids_is_not_a_sequence(simulated_tpu, tmp_path):
    """Item 13: Transformers' `test_resume_from_interrupted_training`: a plain `nn.Module` whose
    `input_ids` are float feature vectors (batch, 10) and labels one class per row. Before the fix, the vectors were
    padded to 16 "tokens": `mat1 and mat2 shapes cannot be multiplied (2x16 and 10x2)`."""

    class DummyModel(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(10, 2)

        def forward(self, input_ids=None, attention_mask=None, labels=None):
            logits = self.linear(input_ids.float())
            loss = torch.nn.functional.cross_entropy(logits, labels) if labels is not None else None
            return {"loss": loss, "logits": logits}

    gen = torch.Generator().manual_seed(0)
    features, classes = torch.rand(30, 10, generator=gen), torch.randint(0, 2, (30,), generator=gen)
    data = [{"input_ids": features[i], "attention_mask": torch.ones(10), "labels": classes[i]} for i in range(30)]

    def run(cpu: bool):
        torch.manual_seed(0)
        trainer = _paths.trainer(tmp_path / _tag(cpu), cpu=cpu, model=DummyModel(), train=data,
                                 per_device_train_batch_size=2, gradient_accumulation_steps=3, max_steps=3,
                                 learning_rate=0.1)
        trainer.train()
        return losses(trainer)

    cpu, tpu = both(run)
    assert max_diff(tpu, cpu) < TOLERANCE, (tpu, cpu)
