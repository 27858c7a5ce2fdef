"""Every command answers a bad argument, option pair or setting in one line naming the fix, with exit
status 2, before it loads a model or starts a worker (issue 36: a first run without alarms).

Each case runs ``transformers-tpu <command> ...`` in-process (``cli.main``) with model loading made to
fail loudly: a case that got as far as ``from_pretrained`` fails."""

from __future__ import annotations

import json

import pytest

from transformers_tpu_ext import cli

BUCKETS = {"TRANSFORMERS_TPU_EXT_GENERATE_PROMPT_BUCKETS": "abc"}
BUCKETS_LINE = ("TRANSFORMERS_TPU_EXT_GENERATE_PROMPT_BUCKETS='abc': expected a comma list of integers: fix it or "
                "unset it (every setting: docs/configuration.md)")


@pytest.fixture
def no_loads(monkeypatch):
    from transformers.models.auto import auto_factory

    def loaded(*args, **kwargs):
        raise AssertionError("a model was loaded before the mistake was found")

    monkeypatch.setattr(auto_factory._BaseAutoModelClass, "from_pretrained", classmethod(loaded))
    for name in list(__import__("os").environ):
        if name.startswith("TRANSFORMERS_TPU_EXT_GENERATE_") or name.startswith("TRANSFORMERS_TPU_EXT_SERVE_"):
            monkeypatch.delenv(name)


@pytest.fixture
def dirs(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    empty = tmp_path / "not-a-model"
    empty.mkdir()
    (empty / "readme.txt").write_text("hi")
    (tmp_path / "train.py").write_text("raise SystemExit('a worker must not start')\n")
    return {"model": str(model), "empty": str(empty), "script": str(tmp_path / "train.py"), "tmp": str(tmp_path)}


def _one_line(capsys, argv: list[str], code: int) -> str:
    assert cli.main(argv) == code
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    prog = "transformers-tpu " + argv[0]
    assert lines[0].startswith(f"{prog}: error: "), lines
    return lines[0][len(prog) + len(": error: "):]


DEMO = [
    (["--max-new-tokens", "-1"], {}, "argument --max-new-tokens: expected a whole number >= 1, got '-1' (see --help)"),
    (["--max-new-tokens", "0"], {}, "argument --max-new-tokens: expected a whole number >= 1, got '0' (see --help)"),
    (["--max-new-tokens", "x"], {}, "argument --max-new-tokens: expected a whole number >= 1, got 'x' (see --help)"),
    (["--seed", "x"], {}, "argument --seed: expected a whole number from"),
    (["--simulate", "maybe"], {}, "argument --simulate: invalid choice: 'maybe'"),
    (["--bogus"], {}, "unrecognized arguments: --bogus (see --help)"),
    (["--prompt", ""], {}, "--prompt is empty: pass some text to continue (default: the guide's prompt)"),
    (["--model", "{empty}"], {}, "--model '{empty}': this directory has no config.json, so it holds no Hugging Face model"),
    (["--model", "{model}/config.json"], {}, "--model '{model}/config.json': a file, not a model directory"),
    ([], BUCKETS, BUCKETS_LINE),
]


@pytest.mark.parametrize("argv, env, expected", DEMO, ids=[" ".join(c[0]) or "settings" for c in DEMO])
def test_demo(no_loads, dirs, capsys, monkeypatch, argv, env, expected):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    line = _one_line(capsys, ["demo", *[a.format(**dirs) for a in argv]], 2)
    assert line.startswith(expected.format(**dirs))


WARMUP = [
    (["{model}", "--train", "0"], {}, "argument --train: expected a whole number >= 1, got '0' (see --help)"),
    (["{model}", "--max-prompt-length", "x", "--max-new-tokens", "4"], {},
     "argument --max-prompt-length: expected a whole number >= 1, got 'x' (see --help)"),
    (["{model}", "--serve", "--max-batch-size", "0"], {}, "argument --max-batch-size: expected a whole number >= 1"),
    (["{model}", "--serve", "--batch-sizes", "0"], {}, "argument --batch-sizes: expected a comma list of batch sizes >= 1"),
    (["{model}", "--serve", "--max-batch-size", "2", "--batch-sizes", "1,2"], {},
     "argument --batch-sizes: not allowed with argument --max-batch-size (see --help)"),
    (["{model}", "--serve", "--max-batch-size", "2"], {},
     "--max-batch-size sizes the generate() work: add --max-prompt-length and --max-new-tokens, or drop it"),
    (["{model}", "--serve", "--bf16"], {}, "--bf16 applies to --train MAX_LENGTH: add it, or drop --bf16"),
    (["{model}", "--serve", "--train-batch-size", "4"], {}, "--train-batch-size applies to --train MAX_LENGTH"),
    (["{model}", "--train", "16", "--do-sample"], {}, "--do-sample applies to generate() and --serve"),
    (["{model}", "--serve", "--dtype", "float17"], {},
     "argument --dtype: unknown dtype 'float17': choose from auto, bfloat16, float16, float32 (see --help)"),
    (["{empty}", "--serve"], {}, "MODEL '{empty}': this directory has no config.json"),
    ([], {}, "the following arguments are required: MODEL (see --help)"),
    (["{model}", "--max-prompt-length", "8", "--max-new-tokens", "2"], BUCKETS, BUCKETS_LINE),
    (["{model}", "--serve"], {"TRANSFORMERS_TPU_EXT_SERVE_MAX_BATCH_TOKENS": "0"},
     "TRANSFORMERS_TPU_EXT_SERVE_MAX_BATCH_TOKENS='0' is invalid: max_batch_tokens must be a positive integer, got 0: "
     "fix it or unset it"),
]


@pytest.mark.parametrize("argv, env, expected", WARMUP, ids=[" ".join(c[0][1:]) or str(c[1]) for c in WARMUP])
def test_warmup(no_loads, dirs, capsys, monkeypatch, argv, env, expected):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    line = _one_line(capsys, ["warmup", *[a.format(**dirs) for a in argv]], 2)
    assert line.startswith(expected.format(**dirs))


DOCTOR = [
    (["--bogus"], "unrecognized arguments: --bogus (see --help)"),
    (["--chips", "4"], "--chips shapes the fit report: add --fit MODEL_OR_CONFIG, or drop --chips"),
    (["--fit", "/does/not/exist"], "--fit '/does/not/exist': no such directory; pass a local model directory"),
    (["--fit", "{empty}"], "--fit '{empty}': this directory has no config.json"),
    (["--fit", "{model}", "--chips", "0"], "argument --chips: expected a comma list of chip counts >= 1"),
    (["--fit", "{model}", "--chips", "3"], "--chips 3: no TPU shown runs that many chips (v4: 1, 2, 4, 8;"),
    (["--fit", "{model}", "--chips", "1", "--generation", "v7"], "--chips 1: no TPU shown runs that many chips (v7: 2, 4, 8)"),
    (["--fit", "{model}", "--generation", "v99"], "argument --generation: unknown TPU generation 'v99': choose from v4,"),
    (["--fit", "{model}", "--weights", "int4"], "argument --weights: unknown weights format 'int4': choose from bf16, int8, fp8"),
    (["--fit", "{model}", "--kv", "fp8"], "argument --kv: unknown KV cache format 'fp8': choose from bf16, int8"),
    (["--fit", "{model}", "--context", "-5"], "argument --context: expected a whole number >= 0, got '-5'"),
    (["--fit", "{model}", "--batch", "0"], "argument --batch: expected a whole number >= 1, got '0'"),
    (["--fit", "{model}", "--import-targets"], "--import-targets is for the installation report: drop it, or drop --fit"),
]


@pytest.mark.parametrize("argv, expected", DOCTOR, ids=[" ".join(c[0]) for c in DOCTOR])
def test_doctor(no_loads, dirs, capsys, argv, expected):
    line = _one_line(capsys, ["doctor", *[a.format(**dirs) for a in argv]], 2)
    assert line.startswith(expected.format(**dirs))


SELFTEST = [
    (["--only", ""], {}, 2, "--only '' names no check: pass a comma list of them (activation, "),
    (["--only", "activation", "--json", "{tmp}/no/such/dir/report.json"], {}, 2,
     "--json '{tmp}/no/such/dir/report.json': no such directory '{tmp}/no/such/dir'; create it or pass another path"),
    (["--only", "activation", "--json", "{tmp}"], {}, 2, "--json '{tmp}' is a directory: pass a file path"),
    (["--only", "activation"], BUCKETS, 2, BUCKETS_LINE),
    (["--only", "activation", "--simulate", "never"], {}, 1,
     "no TPU found and --simulate never: run it on a TPU VM, or drop --simulate never"),
]


@pytest.mark.parametrize("argv, env, code, expected", SELFTEST, ids=[" ".join(c[0]) for c in SELFTEST])
def test_selftest(no_loads, dirs, capsys, monkeypatch, argv, env, code, expected):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    line = _one_line(capsys, ["selftest", *[a.format(**dirs) for a in argv]], code)
    assert line.startswith(expected.format(**dirs))


LAUNCH = [
    (["--nproc_per_node=3", "{script}"], 2,
     "--nproc_per_node=3: no TPU generation has a topology for 3 processes per host (v4: 1, 2, 4, 8; v5p: 1, 2, 4, 8; "
     "v5e: 1, 4, 8; v6e: 1, 4, 8; v7: 2, 4, 8); pass one of those counts"),
    (["--nproc_per_node=0", "{script}"], 2, "--nproc_per_node=0: pass at least 1 (one process per chip)."),
    (["--nproc_per_node=-1", "{script}"], 2, "--nproc_per_node=-1: pass at least 1 (one process per chip)."),
    (["--nproc_per_node=x", "{script}"], 2, "--nproc_per_node=x is not supported on TPU: pass a number of processes"),
    (["--nproc_per_node=4", "{tmp}/missing.py"], 2, "can't open file '{tmp}/missing.py': no such file"),
    (["-m", "no_such_package.train"], 2, "-m no_such_package.train: no module named 'no_such_package.train'"),
    (["--nnodes=x", "{script}"], 2, "--nnodes=x is not a number of hosts; pass e.g. --nnodes=1."),
]


@pytest.mark.parametrize("argv, code, expected", LAUNCH, ids=[" ".join(c[0]) for c in LAUNCH])
def test_launch_without_a_tpu_still_names_the_bad_argument(simulated_tpu, dirs, capsys, monkeypatch, argv, code, expected):
    for name in ("TPU_WORKER_HOSTNAMES", "PET_NPROC_PER_NODE", "PET_NNODES"):
        monkeypatch.delenv(name, raising=False)
    with simulated_tpu.hidden():
        line = _one_line(capsys, ["launch", *[a.format(**dirs) for a in argv]], code)
    assert line.startswith(expected.format(**dirs))


def test_launch_refuses_an_invalid_setting_before_any_worker_starts(simulated_tpu, dirs, capsys, monkeypatch):
    monkeypatch.setenv("TRANSFORMERS_TPU_EXT_GENERATE_PROMPT_BUCKETS", "abc")
    line = _one_line(capsys, ["launch", "--nproc_per_node=1", dirs["script"]], 2)
    assert line == BUCKETS_LINE


def test_a_failure_after_loading_is_one_line_with_the_way_to_its_traceback(capsys, monkeypatch):
    from transformers_tpu_ext.cli import demo

    def generate_fails(args):
        raise RuntimeError("cannot reshape tensor of 0 elements into shape [1, 0, -1, 8]")

    monkeypatch.delenv("TRANSFORMERS_TPU_EXT_VERBOSITY", raising=False)
    monkeypatch.setattr(demo, "run", generate_fails)
    line = _one_line(capsys, ["demo", "--max-new-tokens", "2"], 1)
    assert line == ("RuntimeError: cannot reshape tensor of 0 elements into shape [1, 0, -1, 8] "
                    "(rerun with TRANSFORMERS_TPU_EXT_VERBOSITY=debug for the traceback)")
