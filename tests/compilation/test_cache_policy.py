"""Whether and where the plugin sets torch_tpu's persistent compile cache (pure: ``compilation.cache``)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from transformers_tpu_ext.compilation import cache

ROOT = Path(__file__).resolve().parents[2]
TPU_HOST = cache.Facts(torch_tpu_version="0.2.0", tpu_on_host=True, home="/home/u", cwd="/work")


def plan(environ=None, facts=TPU_HOST, writable=lambda path: True):
    return cache.plan(environ or {}, facts, writable)


def test_by_default_on_a_tpu_host_the_root_is_under_the_hugging_face_cache_per_torch_tpu_release():
    result = plan()
    assert (result.action, result.case) == ("set", "default")
    assert result.root == "/home/u/.cache/huggingface/transformers-tpu-ext/compile-cache/torch_tpu-0.2.0"
    assert not result.explicit
    newer = plan(facts=cache.Facts(torch_tpu_version="0.3.0", tpu_on_host=True, home="/home/u"))
    assert newer.root.endswith("/torch_tpu-0.3.0") and newer.root != result.root


@pytest.mark.parametrize(
    "environ, root",
    [
        ({"HF_HOME": "/data/hf"}, "/data/hf/transformers-tpu-ext/compile-cache/torch_tpu-0.2.0"),
        ({"HF_HOME": "~/hf"}, "/home/u/hf/transformers-tpu-ext/compile-cache/torch_tpu-0.2.0"),
        ({"XDG_CACHE_HOME": "/xdg"}, "/xdg/huggingface/transformers-tpu-ext/compile-cache/torch_tpu-0.2.0"),
    ],
)
def test_the_default_follows_hf_home_as_huggingface_hub_does(environ, root):
    assert plan(environ).root == root


@pytest.mark.parametrize(
    "variable",
    [
        "TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT",
        "TORCH_TPU_INTERNAL_TIER3_COMPILATION_CACHE_ROOT",
        "TORCH_TPU_TIER2_COMPILATION_CACHE",
        "TORCH_TPU_INTERNAL_TIER2_COMPILATION_CACHE",
    ],
)
def test_torch_tpu_variables_set_by_the_user_are_left_alone(variable):
    for setting in ("", "on", "/elsewhere"):
        result = plan({variable: "mine", cache.CACHE_ENV: setting})
        assert (result.action, result.case) == ("leave", "user")
        assert variable in result.reason


@pytest.mark.parametrize("value", ["off", "0", "false", "no", " OFF ", "disabled", "none"])
def test_off_means_off_whatever_the_host(value):
    result = plan({cache.CACHE_ENV: value})
    assert (result.action, result.case, result.root) == ("off", "disabled", None)


def test_without_a_chip_or_without_torch_tpu_the_default_is_off_and_on_opts_in():
    no_chip = cache.Facts(torch_tpu_version=None, tpu_on_host=False, home="/h")
    assert plan(facts=no_chip).case == "no_tpu"
    no_torch_tpu = cache.Facts(torch_tpu_version=None, tpu_on_host=True, home="/h")
    assert plan(facts=no_torch_tpu).case == "no_torch_tpu"
    forced = plan({cache.CACHE_ENV: "on"}, facts=no_chip)
    assert (forced.action, forced.case, forced.explicit) == ("set", "on", True)
    assert forced.root == "/h/.cache/huggingface/transformers-tpu-ext/compile-cache/other-backend"


@pytest.mark.parametrize(
    "value, root",
    [("/srv/tpu-cache", "/srv/tpu-cache"), ("cache/tpu", "/work/cache/tpu"), ("~/c", "/home/u/c"), ("gs://b/c", "gs://b/c")],
)
def test_a_directory_is_used_as_given(value, root):
    result = plan({cache.CACHE_ENV: value}, facts=cache.Facts(torch_tpu_version=None, tpu_on_host=False, home="/home/u", cwd="/work"))
    assert (result.action, result.case, result.root, result.explicit) == ("set", "directory", root, True)


def test_a_root_that_cannot_be_written_is_not_set_because_torch_tpu_would_abort():
    result = plan(writable=lambda path: False)
    assert (result.action, result.case, result.explicit) == ("off", "read_only", False)
    assert "abort" in result.reason and cache.CACHE_ENV in result.reason
    asked = plan({cache.CACHE_ENV: "/ro/cache"}, writable=lambda path: path != "/ro/cache")
    assert (asked.case, asked.explicit) == ("read_only", True)
    remote = plan({cache.CACHE_ENV: "gs://bucket/cache"}, writable=lambda path: False)
    assert remote.action == "set"  # torch_tpu writes it through tsl::Env; nothing to check here


def test_too_late_when_the_backend_compiled_before_activation():
    late = cache.Facts(torch_tpu_version="0.2.0", tpu_on_host=True, compiled_already=True, home="/h")
    result = plan(facts=late)
    assert (result.action, result.case) == ("off", "late")
    assert "before the first TPU operation" in result.reason and cache.ROOT_ENV in result.reason
    assert plan({cache.CACHE_ENV: "/c"}, facts=late).explicit


@pytest.mark.parametrize("raw, parsed", [(None, "auto"), ("", "auto"), (" Auto ", "auto"), ("1", "on"), ("yes", "on"), ("Off", "off"), ("/x", "/x")])
def test_parse_setting(raw, parsed):
    assert cache.parse_setting(raw) == parsed


def test_every_case_is_reachable_and_documented():
    """docs/compile-cache.md's table of cases is the predicate's (cache.CASES), row for row."""
    reached = {
        plan({"TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT": "/x"}).case,
        plan({cache.CACHE_ENV: "off"}).case,
        plan({cache.CACHE_ENV: "of"}).case,
        plan(facts=cache.Facts(None, False)).case,
        plan(facts=cache.Facts(None, True)).case,
        plan(facts=cache.Facts("0.2.0", True, compiled_already=True)).case,
        plan(writable=lambda p: False).case,
        plan().case,
        plan({cache.CACHE_ENV: "on"}).case,
        plan({cache.CACHE_ENV: "/d"}).case,
    }
    assert reached == set(cache.CASES)
    text = (ROOT / "docs" / "compile-cache.md").read_text()
    rows = re.findall(r"^\| `([a-z_]+)` \| (set|leave|off) \| (.+?) \|$", text, flags=re.M)
    assert [(case, action, when) for case, action, when in rows] == [
        (case, action, when) for case, (action, when) in cache.CASES.items()
    ]
