"""lm-eval's ``--model hf`` on the simulated TPU (patch ``lm_eval_hf``): the CPU's scores, and a steady state.

Three local tasks (YAML over JSONL files written here, nothing downloaded) over random texts of a
tiny context-sensitive Qwen3: ``multiple_choice`` (``loglikelihood``), ``loglikelihood_rolling``
(perplexities) and ``generate_until``. Each task has two halves of other documents: the first half
runs the buckets (for ``generate_until``, whose few documents would not: one text of each length),
the second half runs in cache-only mode and compiles nothing. Every per-document
log-likelihood and generated text equals lm-eval on the CPU. Needs the ``lm-eval`` extra: the main
suite skips this file without it; scripts/check_lm_eval.sh installs the extra and runs it.
"""

from __future__ import annotations

import json
import math
import random

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("lm_eval")

import lm_eval  # noqa: E402
from lm_eval.models.huggingface import HFLM  # noqa: E402
from lm_eval.tasks import TaskManager  # noqa: E402

import transformers_tpu_ext as ext  # noqa: E402
from transformers_tpu_ext.testing import tiny  # noqa: E402
from transformers_tpu_ext.testing.tiny_encoders import WORDS, random_texts  # noqa: E402

from _inference import steady  # noqa: E402

pytestmark = pytest.mark.slow  # ~40 s: six small tasks on the CPU and on the TPU

_TASKS = {
    "multiple_choice": {"output_type": "multiple_choice", "doc_to_text": "{{q}}", "doc_to_choice": "{{choices}}",
                        "doc_to_target": "{{label}}", "metric_list": [{"metric": "acc"}]},
    "rolling": {"output_type": "loglikelihood_rolling", "doc_to_text": "", "doc_to_target": "{{q}}",
                "metric_list": [{"metric": "word_perplexity"}, {"metric": "bits_per_byte"}]},
    "generate": {"output_type": "generate_until", "doc_to_text": "{{q}}", "doc_to_target": "{{a}}",
                 "generation_kwargs": {"until": ["."], "max_gen_toks": 4, "do_sample": False},
                 "metric_list": [{"metric": "exact_match"}]},
}


def _docs(count: int, seed: int, covering: bool = False) -> list[dict]:
    rng = random.Random(seed)
    texts = random_texts(count, seed=seed, longest=24)
    if covering:  # one text of each word count: generate()'s prompt buckets all run in the first half
        texts = [" ".join(rng.choice(WORDS) for _ in range(words)) for words in range(1, 25)]
    return [{"q": text, "choices": [" " + " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 4))) for _ in range(3)],
             "label": rng.randrange(3), "a": " " + rng.choice(WORDS)} for text in texts]


@pytest.fixture(scope="module")
def local_tasks(tmp_path_factory):
    """A task directory: for each kind, ``tiny_<kind>_1`` and ``tiny_<kind>_2`` over other documents."""
    root = tmp_path_factory.mktemp("lm_eval")
    counts = {"multiple_choice": 24, "rolling": 16, "generate": 8}
    for kind, spec in _TASKS.items():
        for half in (1, 2):
            data = root / f"{kind}_{half}.jsonl"
            docs = _docs(counts[kind], seed=10 * half + len(kind), covering=kind == "generate" and half == 1)
            data.write_text("".join(json.dumps(d) + "\n" for d in docs))
            task = {"task": f"tiny_{kind}_{half}", "dataset_path": "json", "dataset_kwargs": {"data_files": {"test": str(data)}},
                    "test_split": "test", **spec}
            (root / f"tiny_{kind}_{half}.yaml").write_text(json.dumps(task))  # JSON is YAML
    tiny.save_tiny_model(root / "model", "qwen3")
    return root


def _evaluate(root, lm, tasks: list[str]) -> dict:
    return lm_eval.simple_evaluate(model=lm, tasks=tasks, task_manager=TaskManager(include_path=str(root)), log_samples=True)


def _per_document(result: dict, task: str) -> list:
    return [sample["resps"] for sample in sorted(result["samples"][task], key=lambda s: s["doc_id"])]


def _same(ours, cpu, path="") -> None:
    if isinstance(cpu, dict):
        assert list(ours) == list(cpu), path
        for key in cpu:
            _same(ours[key], cpu[key], f"{path}[{key!r}]")
    elif isinstance(cpu, (list, tuple)):
        assert len(ours) == len(cpu), path
        for index, (a, b) in enumerate(zip(ours, cpu)):
            _same(a, b, f"{path}[{index}]")
    elif isinstance(cpu, float):
        assert math.isclose(ours, cpu, rel_tol=1e-5, abs_tol=1e-4), f"{path}: {ours} != {cpu}"
    else:
        assert ours == cpu, f"{path}: {ours!r} != {cpu!r}"


@pytest.mark.parametrize("kind", list(_TASKS))
def test_lm_eval_hf_gives_the_cpus_scores_at_steady_state(simulated_tpu, local_tasks, kind):
    ext.activate()
    assert "lm_eval_hf" in ext.active_patches()
    first, second = f"tiny_{kind}_1", f"tiny_{kind}_2"
    cpu = _evaluate(local_tasks, HFLM(pretrained=str(local_tasks / "model"), device="cpu", batch_size=4), [first, second])
    lm = HFLM(pretrained=str(local_tasks / "model"), device="tpu", batch_size=4)  # what --model_args ...,device=tpu makes
    assert lm.model.device.type == "tpu"
    ours = _evaluate(local_tasks, lm, [first])
    with steady(f"the second half of lm-eval's {kind} task"):
        more = _evaluate(local_tasks, lm, [second])
    for task, result in ((first, ours), (second, more)):
        _same(_per_document(result, task), _per_document(cpu, task), task)
        _same(result["results"][task], cpu["results"][task], task)
    scores = [r for doc in _per_document(cpu, first) for r in doc]
    assert len({json.dumps(s) for s in scores}) > len(scores) // 2, "a constant model proves nothing"
