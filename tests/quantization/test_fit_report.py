"""The fit report from a config (``fit_report``, ``transformers-tpu doctor --fit``): counted on the meta device,
and equal to the bytes the same model holds once loaded on the simulated TPU."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from transformers import AutoModelForCausalLM, LlamaConfig  # noqa: E402

from transformers_tpu_ext.cli import doctor  # noqa: E402
from transformers_tpu_ext.quantization import capacity, fit_report  # noqa: E402
from transformers_tpu_ext.quantization.runtime import count, resident_bytes  # noqa: E402
from transformers_tpu_ext.testing import tiny  # noqa: E402

LLAMA_8B = dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                num_key_value_heads=8, vocab_size=128256, tie_word_embeddings=False)


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    root = tmp_path_factory.mktemp("fit")
    llama8b = root / "llama-8b"
    LlamaConfig(**LLAMA_8B).save_pretrained(llama8b)
    return {
        "llama": str(tiny.save_tiny_model(root / "llama", "llama")),
        "qwen3": str(tiny.save_tiny_model(root / "qwen3", "qwen3")),
        "fp8": str(tiny.save_tiny_fp8_model(root / "fp8", "llama")),
        "llama8b": str(llama8b),
    }


def _on_tpu(model) -> int:
    return resident_bytes([*model.parameters(), *model.buffers()], lambda t: t.device.type == "tpu")


def _buffers(model) -> int:
    return sum(b.numel() * b.element_size() for b in model.buffers())


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_predicted_bf16_bytes_are_the_bytes_on_the_tpu(simulated_tpu, paths, arch):
    simulated_tpu.configure(chips=1)
    model = AutoModelForCausalLM.from_pretrained(paths[arch], dtype=torch.bfloat16, device_map="auto")
    predicted = sum(capacity.weight_bytes(count(model.config), "bf16").values())
    assert _on_tpu(model) - _buffers(model) == predicted  # tied embeddings (qwen3) counted once


def test_predicted_int8_bytes_are_the_bytes_torchao_puts_on_the_tpu(simulated_tpu, paths):
    pytest.importorskip("torchao")
    from torchao.quantization import Int8WeightOnlyConfig
    from transformers import TorchAoConfig

    simulated_tpu.configure(chips=1)
    model = AutoModelForCausalLM.from_pretrained(
        paths["llama"], dtype=torch.bfloat16, device_map="auto", quantization_config=TorchAoConfig(Int8WeightOnlyConfig())
    )
    assert type(model.model.layers[0].mlp.up_proj.weight).__name__ == "Int8Tensor"
    predicted = sum(capacity.weight_bytes(count(model.config), "int8").values())
    assert _on_tpu(model) - _buffers(model) == predicted


def test_the_serving_cache_budget_counts_int8_weights_by_their_inner_tensors(simulated_tpu, paths):
    # The paged cache is sized from HBM minus these bytes. Keyed by data_ptr() (0 for every torchao Int8Tensor,
    # and a handle that must never be a key on a chip), all int8 weights collapsed into one tensor of the outer dtype.
    pytest.importorskip("torchao")
    from torchao.quantization import Int8WeightOnlyConfig
    from transformers import TorchAoConfig

    from transformers_tpu_ext.serving.patch_continuous_batching import _resident_bytes

    simulated_tpu.configure(chips=1)
    model = AutoModelForCausalLM.from_pretrained(
        paths["llama"], dtype=torch.bfloat16, device_map="auto", quantization_config=TorchAoConfig(Int8WeightOnlyConfig())
    )
    weights = [p for p in model.parameters() if type(p).__name__ == "Int8Tensor"]
    assert len(weights) > 1 and {p.data_ptr() for p in weights} == {0}

    def inner(t):  # torchao's own declaration of the tensors a subclass holds
        names = [*getattr(t, "tensor_data_names", []), *getattr(t, "optional_tensor_data_names", [])]
        return [getattr(t, n) for n in names if getattr(t, n, None) is not None] if names else [t]

    truth = sum(leaf.numel() * leaf.element_size() for t in [*model.parameters(), *model.buffers()] for leaf in inner(t))
    assert _resident_bytes(model) == _on_tpu(model) == truth


def test_an_fp8_checkpoint_is_reported_in_fp8_first(paths):
    reports = fit_report(paths["fp8"], chips=1, generations="v6e")
    assert [r.weights for r in reports] == ["fp8", "bf16", "int8"]


def test_the_8b_model_from_its_config(paths):
    bf16, int8 = fit_report(paths["llama8b"], weights=("bf16", "int8"), generations=("v5e",), chips=(1,))
    assert bf16.weight_bytes == 2 * 8_030_261_248
    assert not bf16.chips[0].fits and int8.chips[0].fits
    # The same from a config object, a config.json file and a model built from it.
    config = LlamaConfig(**LLAMA_8B)
    assert fit_report(config, weights="int8", generations="v5e", chips=1) == [int8]
    assert fit_report(paths["llama8b"] + "/config.json", weights="int8", generations="v5e", chips=1) == [int8]


def test_doctor_fit_json(paths, capsys):
    code = doctor.main(["--fit", paths["llama8b"], "--chips", "1,4", "--generation", "v5e,v6e,v5p",
                        "--weights", "bf16,fp8", "--kv", "bf16,int8", "--context", "8192", "--batch", "4", "--json"])
    assert code == 0
    reports = json.loads(capsys.readouterr().out)
    assert [(r["weights"], r["kv"]) for r in reports] == [("bf16", "bf16"), ("bf16", "int8"), ("fp8", "bf16"), ("fp8", "int8")]
    rows = reports[0]["chips"]
    assert {(row["generation"], row["chips"]) for row in rows} == {("v5e", 1), ("v5e", 4), ("v6e", 1), ("v6e", 4), ("v5p", 1), ("v5p", 4)}
    assert reports[0]["context"] == 8192 and reports[0]["batch"] == 4
    assert reports[1]["kv_bytes_per_position"] < 0.52 * reports[0]["kv_bytes_per_position"]


def test_doctor_fit_text(paths, capsys):
    assert doctor.main(["--fit", paths["qwen3"], "--chips", "1", "--weights", "int8"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Qwen3ForCausalLM: weights int8") and "v6e" in out and "steps/s" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--fit", "/nonexistent/model"], "transformers-tpu doctor: error: --fit '/nonexistent/model': no such directory"),
        (["--fit", "CONFIG", "--weights", "int4"], "unknown weights format 'int4'"),
    ],
)
def test_doctor_fit_errors_are_one_line(paths, capsys, argv, message):
    argv = [paths["llama8b"] if a == "CONFIG" else a for a in argv]
    assert doctor.main(argv) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("arch, experts, per_token", [("mixtral", 4, 2), ("qwen3_moe", 8, 2), ("gpt_oss", 4, 2),
                                                       ("deepseek_v3", 8, 2)])
def test_a_mixture_of_experts_config_counts_its_routed_experts(arch, experts, per_token):
    config = tiny.tiny_config(arch)
    counts = count(config)
    assert (counts.experts, counts.experts_per_token) == (experts, per_token)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    stacks = sum(p.numel() for name, p in model.named_parameters() if p.dim() == 3 and "experts" in name)
    assert counts.expert_linear == stacks > 0
    report = fit_report(config, weights="bf16", kv="bf16", generations="v6e", chips=1, batch=1)[0]
    assert report.experts[:2] == (experts, per_token)
