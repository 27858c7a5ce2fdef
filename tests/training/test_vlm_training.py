"""Issue 38: fine-tuning vision-language models with the Trainer on the simulated TPU, equal to the CPU.

An image + text dataset (one image an example, prompts of varied lengths) collated by the family's own
processor (right padding, labels -100 on the padding and the image tokens); two epochs; the losses equal the
CPU's, the batches are padded to buckets (the text on the right, the images' inputs as the processor made
them, no row added), and the second epoch compiles nothing.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("PIL")

from _training import losses, max_diff, requires_trainer, reset_accelerate  # noqa: E402

from transformers_tpu_ext.testing import tiny_vlm  # noqa: E402

pytestmark = [pytest.mark.slow, requires_trainer]


def _dataset(family: str, count: int = 16):
    import random

    rng = random.Random(1)
    images = tiny_vlm.vlm_images(count, seed=3, sizes=(tiny_vlm.IMAGE_SIZES[0],))
    words = tiny_vlm._WORDS
    return [{"text": f"{tiny_vlm._PLACEHOLDER[family]} " + " ".join(rng.choice(words) for _ in range(rng.randint(2, 14))),
             "image": image} for image in images]


def _collate(processor, model):
    placeholders = [getattr(model.config, name, None) for name in ("image_token_id", "video_token_id")]

    def collate(examples):
        processor.tokenizer.padding_side = "right"
        batch = dict(processor(text=[e["text"] for e in examples], images=[[e["image"]] for e in examples],
                               return_tensors="pt", padding=True))
        labels = batch["input_ids"].clone()
        labels[batch["attention_mask"] == 0] = -100
        for token in placeholders:
            if token is not None:
                labels[labels == token] = -100
        batch["labels"] = labels
        return batch

    return collate


def _run(family: str, tmp: str, use_cpu: bool, callbacks=()):
    from transformers import Trainer, TrainingArguments

    reset_accelerate()
    model, processor = tiny_vlm.tiny_vlm(family)
    args = TrainingArguments(output_dir=tmp, per_device_train_batch_size=4, num_train_epochs=2, logging_steps=1,
                             report_to=[], learning_rate=1e-3, save_strategy="no", seed=0, disable_tqdm=True,
                             use_cpu=use_cpu, remove_unused_columns=False)
    trainer = Trainer(model=model, args=args, train_dataset=_dataset(family), data_collator=_collate(processor, model),
                      callbacks=list(callbacks))
    trainer.train()
    return trainer


@pytest.mark.parametrize("family", ["llava", "qwen2_vl"])
def test_two_epochs_equal_the_cpu_and_the_second_compiles_nothing(simulated_tpu, tmp_path, family, caplog):
    from transformers import TrainerCallback

    cpu = losses(_run(family, str(tmp_path / "cpu"), use_cpu=True))

    class Epochs(TrainerCallback):
        programs: list = []

        def on_epoch_begin(self, args, state, control, **kwargs):
            self._before = simulated_tpu.counters()

        def on_epoch_end(self, args, state, control, **kwargs):
            Epochs.programs.append((simulated_tpu.counters() - self._before).programs)

    run = _run(family, str(tmp_path / "tpu"), use_cpu=False, callbacks=[Epochs()])
    assert run.args.device.type == "tpu"
    assert max_diff(losses(run), cpu) < 1e-4, (losses(run), cpu)
    lengths = run.__dict__.get("_tpu_ext_bucket_lengths")
    assert lengths, "the batches were not padded to buckets"
    assert len(Epochs.programs) == 2 and Epochs.programs[0] > 0 and Epochs.programs[1] == 0, Epochs.programs
    assert not any("left as the collator made them" in r.getMessage() for r in caplog.records)
