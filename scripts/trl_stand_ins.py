"""Offline stand-ins for the Hub repositories TRL's own tests load most (for scripts/peer_trl.sh).

TRL's tests (tests/test_sft_trainer.py, test_dpo_trainer.py, test_grpo_trainer.py) load tiny models and the
"zen" dataset from the Hub (trl-internal-testing/...). The runs are offline, so this script writes local
stand-ins under the same repo ids in a Hugging Face cache directory (``HF_HUB_CACHE``):

- ``trl-internal-testing/zen``: the dataset, built by TRL's own ``scripts/generate_zen_dataset.py`` (taken from
  the TRL checkout given with ``--trl-src``), every config with its train/test split, as parquet files;
- tiny Qwen2.5 / Qwen3 causal LMs and sequence classifiers, with the shapes of TRL's
  ``scripts/generate_tiny_models`` (hidden size 8, 2 layers) but a local tokenizer: a byte-level BPE trained
  here (the real Qwen vocabulary of 151k tokens cannot be fetched offline) with Qwen's special tokens and
  TRL's own copy of each model's chat template (``trl/chat_templates/*.jinja``);
- a tiny T5 (``tiny-T5ForConditionalGeneration``, which the ORPO and CPO suites load in their set-up),
  with the same local tokenizer.

Tests that depend on the real tokenizer's ids or vocabulary fail alike with and without the plugin; the
comparison that matters (plugin on vs off) is unaffected. Every other Hub repository stays missing ("needs
network").

Usage: python scripts/trl_stand_ins.py --trl-src /tmp/trl_tests --cache /tmp/peer_trl/hub --datasets-cache /tmp/peer_trl/ds
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import sys
from pathlib import Path

ORG = "trl-internal-testing"
# repo name -> (architecture, chat template in trl/chat_templates, head)
MODELS = {
    "tiny-Qwen2ForCausalLM-2.5": ("qwen2", "qwen2_5", "causal"),
    "tiny-Qwen2ForSequenceClassification-2.5": ("qwen2", "qwen2_5", "seqcls"),
    "tiny-Qwen3ForCausalLM": ("qwen3", "qwen3", "causal"),
    "tiny-Qwen3ForSequenceClassification": ("qwen3", "qwen3", "seqcls"),
    "tiny-T5ForConditionalGeneration": ("t5", "qwen2_5", "seq2seq"),
}
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>", "<think>", "</think>"]


def _snapshot(cache: Path, kind: str, repo_id: str, salt: str) -> Path:
    repo = cache / f"{kind}--{repo_id.replace('/', '--')}"
    revision = hashlib.sha1(f"stand-in:{repo_id}:{salt}".encode()).hexdigest()
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(revision)
    snap = repo / "snapshots" / revision
    snap.mkdir(parents=True, exist_ok=True)
    return snap


def zen_dataset(trl_src: Path, cache: Path) -> list[str]:
    """Run TRL's generate_zen_dataset.main with push_to_hub=True, catching each push as parquet files."""
    import datasets

    spec = importlib.util.spec_from_file_location("generate_zen_dataset", trl_src / "scripts/generate_zen_dataset.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    snap = _snapshot(cache, "datasets", f"{ORG}/zen", "zen")
    configs: list[str] = []

    def push(self, repo_id, config_name="default", **_):
        for split, ds in self.items():
            ds.to_parquet(str(snap / config_name / f"{split}-00000-of-00001.parquet"))
        configs.append(config_name)

    original = datasets.DatasetDict.push_to_hub
    datasets.DatasetDict.push_to_hub = push
    try:
        module.main(0.1, True, f"{ORG}/zen")
    finally:
        datasets.DatasetDict.push_to_hub = original
    lines = ["---", "configs:"]
    for name in configs:
        lines += [f"- config_name: {name}", "  data_files:"]
        for split in ("train", "test"):
            lines += [f"  - split: {split}", f"    path: {name}/{split}-*"]
    (snap / "README.md").write_text("\n".join(lines + ["---", "", "Offline stand-in of trl-internal-testing/zen."]) + "\n")
    return configs


def datasets_cache(hub_cache: Path, datasets_cache: Path) -> None:
    """Prepare each zen config in the datasets cache as ``load_dataset`` leaves it after a download.

    Offline, ``load_dataset("trl-internal-testing/zen", config)`` reads only that cache ("Using the latest cached
    version of the dataset"), not the hub cache."""
    import shutil

    from datasets.packaged_modules.parquet.parquet import Parquet

    snap = next(hub_cache.glob("datasets--*zen/snapshots/*"))
    root = datasets_cache / f"{ORG}___zen"
    shutil.rmtree(root, ignore_errors=True)
    for config in sorted(p.name for p in snap.iterdir() if p.is_dir()):
        files = {split: str(snap / config / f"{split}-00000-of-00001.parquet") for split in ("train", "test")}
        builder = Parquet(cache_dir=str(datasets_cache / "_build"), dataset_name="zen", config_name=config,
                          data_files=files, hash="stand-in")
        builder.download_and_prepare()
        built = Path(builder.cache_dir)  # _build/zen/<config id>/0.0.0/stand-in
        (root / config).mkdir(parents=True, exist_ok=True)
        shutil.move(str(built.parent), str(root / config / built.parts[-2]))
    shutil.rmtree(datasets_cache / "_build")


def tokenizer(template: str, corpus: list[str]):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600, special_tokens=SPECIAL, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>", padding_side="right",
        additional_special_tokens=SPECIAL[1:],
    )
    fast.chat_template = template
    return fast


def tiny_models(cache: Path) -> list[str]:
    import torch
    import trl
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSeq2SeqLM, AutoModelForSequenceClassification, GenerationConfig

    import datasets  # the corpus: every string of the zen dataset, so the BPE has merges for its words

    corpus = []
    zen = next(cache.glob("datasets--*zen/snapshots/*"))
    for parquet in zen.glob("*/*.parquet"):
        corpus += [json.dumps(row) for row in datasets.Dataset.from_parquet(str(parquet)).to_list()]
    templates = Path(trl.__file__).parent / "chat_templates"
    made = []
    for name, (arch, template, head) in MODELS.items():
        tok = tokenizer((templates / f"{template}.jinja").read_text(), corpus)
        pad, eos = tok.convert_tokens_to_ids(["<|endoftext|>", "<|im_end|>"])
        torch.manual_seed(int(hashlib.sha1(name.encode()).hexdigest(), 16) % 2**31)
        if head == "seq2seq":
            config = AutoConfig.for_model(
                arch, vocab_size=len(tok), d_model=8, d_kv=2, d_ff=32, num_layers=2, num_heads=4, pad_token_id=pad,
                eos_token_id=eos, decoder_start_token_id=pad, initializer_factor=1.0,
            )
            snap = _snapshot(cache, "models", f"{ORG}/{name}", name)
            AutoModelForSeq2SeqLM.from_config(config).save_pretrained(snap)
            tok.save_pretrained(snap)
            made.append(f"{ORG}/{name}")
            continue
        config = AutoConfig.for_model(
            arch, vocab_size=len(tok), hidden_size=8, num_attention_heads=4, num_key_value_heads=2,
            num_hidden_layers=2, intermediate_size=32, head_dim=2, pad_token_id=pad, eos_token_id=eos,
            bos_token_id=None, tie_word_embeddings=True, initializer_range=0.3, max_position_embeddings=32768,
        )
        if head == "causal":
            model = AutoModelForCausalLM.from_config(config)
        else:
            config.num_labels = 1
            model = AutoModelForSequenceClassification.from_config(config)
        snap = _snapshot(cache, "models", f"{ORG}/{name}", name)
        model.save_pretrained(snap)
        tok.save_pretrained(snap)
        if head == "causal":
            GenerationConfig(bos_token_id=None, eos_token_id=[eos, pad], pad_token_id=pad, do_sample=True,
                             temperature=0.7, top_p=0.8, top_k=20).save_pretrained(snap)
        made.append(f"{ORG}/{name}")
    return made


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trl-src", type=Path, required=True, help="a TRL checkout (holds scripts/generate_zen_dataset.py)")
    parser.add_argument("--cache", type=Path, required=True, help="the HF_HUB_CACHE directory to write")
    parser.add_argument("--datasets-cache", type=Path, required=True, help="the HF_DATASETS_CACHE directory to write")
    args = parser.parse_args(argv)
    configs = zen_dataset(args.trl_src, args.cache)
    datasets_cache(args.cache, args.datasets_cache)
    made = tiny_models(args.cache)
    print(f"{ORG}/zen: {len(configs)} configs; models: {', '.join(made)}")


if __name__ == "__main__":
    sys.exit(main())
