"""Which Hub-kernels call on TPU takes which path (``kernels.policy.kernels_path``), and its docs table."""

from __future__ import annotations

import pytest

from transformers_tpu_ext.kernels import policy
from transformers_tpu_ext.kernels.policy import kernels_path


@pytest.mark.parametrize("requested", [True, False])
@pytest.mark.parametrize("jax", [True, False])
@pytest.mark.parametrize("enable", [True, False])
def test_off_a_tpu_every_call_is_upstreams(requested, jax, enable):
    assert kernels_path(on_tpu=False, requested=requested, enable=enable, jax=jax).path == policy.UPSTREAM


@pytest.mark.parametrize("jax", [True, False])
def test_transformers_default_is_skipped_on_tpu_with_or_without_jax(jax):
    plan = kernels_path(on_tpu=True, requested=False, enable=True, jax=jax)
    assert plan.path == policy.SKIP and "use_kernels=True" in plan.reason


def test_a_request_needs_jax():
    assert kernels_path(on_tpu=True, requested=True, enable=True, jax=False).path == policy.REFUSE
    assert kernels_path(on_tpu=True, requested=True, enable=True, jax=True).path == policy.UPSTREAM


@pytest.mark.parametrize("requested", [True, False])
def test_turning_kernels_off_is_always_upstreams(requested):
    assert kernels_path(on_tpu=True, requested=requested, enable=False, jax=False).path == policy.UPSTREAM


def test_the_docs_table_is_the_policys():
    from pathlib import Path

    page = (Path(__file__).resolve().parents[2] / "docs" / "doctor.md").read_text()
    begin = page.index(policy.BEGIN) + len(policy.BEGIN)
    assert page[begin : page.index(policy.END, begin)].strip() == policy.path_table()
