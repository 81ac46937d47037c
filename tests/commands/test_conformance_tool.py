"""``benchmarks/diffusers_conformance.py`` and its offline stand-ins plugin, on a stand-in checkout: a test file that
loads the Hub's tiny T5 the way diffusers' tests do, run on stock cpu and on the JAX device; the table and the summary
say what differs (the real diffusers tests: docs/conformance.md)."""

import textwrap

from benchmarks import diffusers_conformance as conformance

TEST_FILE = """
import pytest
import torch
from transformers import AutoConfig, AutoTokenizer, T5EncoderModel

DEVICE = __import__("os").environ["DIFFUSERS_TEST_DEVICE"]


def test_hub_standins_load_offline():
    config = AutoConfig.from_pretrained("hf-internal-testing/tiny-random-t5")
    tokenizer = AutoTokenizer.from_pretrained("hf-internal-testing/tiny-random-t5")
    model = T5EncoderModel.from_pretrained("hf-internal-testing/tiny-random-t5")
    ids = tokenizer(["dance monkey"], return_tensors="pt").input_ids
    assert config.d_model == 32 and model(ids).last_hidden_state.shape[-1] == 32


def test_only_stock_passes():
    assert DEVICE == "cpu", "runs on " + DEVICE


def test_needs_an_accelerator():
    if DEVICE == "cpu":
        pytest.skip("test requires a hardware accelerator")
    assert torch.device(DEVICE).type == "jax"
"""


def test_the_tool_runs_a_checkout_on_both_devices_and_names_what_differs(tmp_path):
    pipelines = tmp_path / "tests" / "pipelines" / "standin"
    pipelines.mkdir(parents=True)
    (pipelines / "test_standin.py").write_text(textwrap.dedent(TEST_FILE))
    markdown = tmp_path / "table.md"
    assert conformance.main([str(tmp_path), "--files", "standin/test_standin.py", "--markdown", str(markdown)]) == 0
    text = markdown.read_text()
    assert "| standin/test_standin.py::test_hub_standins_load_offline | passed | passed |" in text
    assert "| standin/test_standin.py::test_only_stock_passes | passed | failed | AssertionError: runs on jax" in text
    assert "| standin/test_standin.py::test_needs_an_accelerator | skipped | passed |" in text
    assert "jax: 1 tests that pass on stock cpu do not pass here" in text
    assert "jax: 0 tests that stock skips on cpu fail here (0 skipped here too)" in text
