"""What every ``transformers-tpu`` command shares: one-line usage errors, argument types that say what
they expect, invalid settings refused up front, models found before anything loads, and a failure
while working answered in one line with the way to its traceback (pure functions: milliseconds)."""

from __future__ import annotations

import argparse
import json
import re

import pytest

from transformers_tpu_ext.cli import args, models, running


def _err(capsys) -> list[str]:
    return capsys.readouterr().err.strip().splitlines()


# ---- the parser ---------------------------------------------------------------------------------------


def test_a_usage_error_is_one_line_naming_the_command(capsys):
    parser = args.Parser(prog="transformers-tpu thing")
    parser.add_argument("model")
    parser.add_argument("--count", type=args.positive_int)
    assert args.parse(parser, []) == 2
    assert _err(capsys) == ["transformers-tpu thing: error: the following arguments are required: model (see --help)"]
    assert args.parse(parser, ["m", "--count", "-1"]) == 2
    assert _err(capsys) == [
        "transformers-tpu thing: error: argument --count: expected a whole number >= 1, got '-1' (see --help)"
    ]
    assert args.parse(parser, ["--help"]) == 0
    assert args.parse(parser, ["m", "--count", "3"]).count == 3


@pytest.mark.parametrize(
    "parse, text, expected",
    [
        (args.positive_int, "4", 4),
        (args.positive_int, " 1 ", 1),
        (args.non_negative_int, "0", 0),
        (args.seed, "-1", -1),
        (args.int_list, "8,1,4,4", [1, 4, 8]),
        (args.dtype, "torch.bfloat16", "bfloat16"),
        (args.dtype, "auto", "auto"),
        (args.names(("v5e", "v6e"), "TPU generation"), "v6e,v5e", ["v6e", "v5e"]),
    ],
)
def test_types_take_what_they_name(parse, text, expected):
    assert parse(text) == expected


@pytest.mark.parametrize(
    "parse, text, message",
    [
        (args.positive_int, "0", "expected a whole number >= 1, got '0'"),
        (args.positive_int, "x", "expected a whole number >= 1, got 'x'"),
        (args.non_negative_int, "-5", "expected a whole number >= 0, got '-5'"),
        (args.seed, str(2**64), "expected a whole number from"),
        (args.int_list, "1,x", "expected a comma list of numbers >= 1 (e.g. 1,4,8), got '1,x'"),
        (args.int_list, "0,4", "expected a comma list of numbers >= 1 (e.g. 1,4,8), got '0,4'"),
        (args.int_list, "", "expected a comma list of numbers >= 1 (e.g. 1,4,8), got ''"),
        (args.dtype, "float17", "unknown dtype 'float17': choose from auto, bfloat16, float16, float32"),
        (args.names(("bf16", "int8"), "KV cache format"), "fp8", "unknown KV cache format 'fp8': choose from bf16, int8"),
        (args.names(("bf16", "int8"), "KV cache format"), ",", "unknown KV cache format ',': choose from"),
    ],
)
def test_types_refuse_with_what_they_expect(parse, text, message):
    with pytest.raises(argparse.ArgumentTypeError, match="^" + re.escape(message)):
        parse(text)


# ---- settings -------------------------------------------------------------------------------------------


def test_invalid_settings_are_refused_and_unknown_names_are_not():
    environ = {
        "TRANSFORMERS_TPU_EXT_GENERATE_PROMPT_BUCKETS": "abc",
        "TRANSFORMERS_TPU_EXT_SERVE_MAX_BATCH_TOKENS": "0",
        "TRANSFORMERS_TPU_EXT_NO_SUCH_SETTING": "1",  # ignored (activation warns): a command runs on
    }
    errors = args.setting_errors(environ)
    assert len(errors) == 2 and all("NO_SUCH_SETTING" not in error for error in errors)
    with pytest.raises(args.CommandError) as refused:
        args.check_settings(environ)
    message = str(refused.value)
    assert refused.value.exit_code == 2
    assert message.startswith("TRANSFORMERS_TPU_EXT_GENERATE_PROMPT_BUCKETS='abc': expected a comma list of integers; ")
    assert "TRANSFORMERS_TPU_EXT_SERVE_MAX_BATCH_TOKENS='0'" in message and message.endswith(
        ": fix them or unset them (every setting: docs/configuration.md)")
    args.check_settings({"TRANSFORMERS_TPU_EXT_NO_SUCH_SETTING": "1"})  # no error


# ---- models -----------------------------------------------------------------------------------------------


def test_a_directory_without_a_model_is_refused_at_once(tmp_path):
    (tmp_path / "readme.txt").write_text("hi")
    with pytest.raises(args.CommandError, match=r"^MODEL '.*': this directory has no config.json, so it holds no "
                       r"Hugging Face model; pass a directory save_pretrained\(\) wrote"):
        models.resolve_model(str(tmp_path), option="MODEL")
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(args.CommandError, match="its config.json is not a JSON object"):
        models.resolve_model(str(tmp_path))
    (tmp_path / "config.json").write_text("{broken")
    with pytest.raises(args.CommandError, match="its config.json cannot be read"):
        models.resolve_model(str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    assert models.resolve_model(str(tmp_path)) == str(tmp_path)


def test_a_file_is_a_model_only_where_a_config_file_is_taken(tmp_path):
    config = tmp_path / "config.json"
    config.write_text("{}")
    with pytest.raises(args.CommandError, match=r"^--model '.*config.json': a file, not a model directory"):
        models.resolve_model(str(config))
    assert models.resolve_model(str(config), option="--fit", config_file=True) == str(config)


def test_a_hub_id_offline_and_not_cached_is_refused_without_the_network(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(args.CommandError) as refused:
        models.resolve_model("someone/not-cached", option="--fit")
    assert refused.value.exit_code == 2
    assert str(refused.value).startswith("--fit 'someone/not-cached': not a local directory and not in the Hugging "
                                         "Face cache, and HF_HUB_OFFLINE is set")


# ---- a failure while working ------------------------------------------------------------------------------


def test_a_failure_while_working_is_one_line_with_the_way_to_its_traceback(capsys, monkeypatch):
    monkeypatch.delenv("TRANSFORMERS_TPU_EXT_VERBOSITY", raising=False)

    def fails() -> int:
        raise RuntimeError("cannot reshape tensor of 0 elements\ninto shape [1, 0, -1, 8]")

    assert running.run("transformers-tpu demo", fails) == 1
    assert _err(capsys) == [
        "transformers-tpu demo: error: RuntimeError: cannot reshape tensor of 0 elements into shape [1, 0, -1, 8] "
        "(rerun with TRANSFORMERS_TPU_EXT_VERBOSITY=debug for the traceback)"
    ]
    monkeypatch.setenv("TRANSFORMERS_TPU_EXT_VERBOSITY", "debug")
    assert running.run("transformers-tpu demo", fails) == 1
    err = _err(capsys)
    assert err[0] == "Traceback (most recent call last):" and "in fails" in "\n".join(err)
    assert err[-1] == "transformers-tpu demo: error: RuntimeError: cannot reshape tensor of 0 elements into shape [1, 0, -1, 8]"


def test_a_command_error_keeps_its_exit_status_and_ctrl_c_is_one_word(capsys):
    def no_tpu() -> int:
        raise args.CommandError("no TPU is seen here: run it on a TPU VM", exit_code=1)

    assert running.run("transformers-tpu warmup", no_tpu) == 1
    assert _err(capsys) == ["transformers-tpu warmup: error: no TPU is seen here: run it on a TPU VM"]

    def interrupted() -> int:
        raise KeyboardInterrupt

    assert running.run("transformers-tpu warmup", interrupted) == 130
    assert _err(capsys) == ["transformers-tpu warmup: error: interrupted"]
    assert running.run("transformers-tpu warmup", lambda: None) == 0


def test_a_long_message_is_cut():
    line = running.describe(ValueError("x" * 2000))
    assert line.startswith("ValueError: xxx") and line.endswith("...") and len(line) < running.MESSAGE_CHARS + 20
