"""``benchmarks/diffusers_conformance.py`` and its offline stand-ins plugin, on a stand-in checkout: a test file that
loads the Hub's tiny T5 the way diffusers' tests do, run on stock cpu and on the JAX device; the table and the summary
say what differs (the real diffusers tests: docs/conformance.md)."""

import textwrap

import pytest

from benchmarks import diffusers_conformance as conformance

pytestmark = pytest.mark.slow  # minutes in all: CI's second command (setup.cfg)

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


def test_qwen_vl_processor_saves_and_loads_back(tmp_path):
    from transformers import Qwen2VLProcessor

    processor = Qwen2VLProcessor.from_pretrained("hf-internal-testing/tiny-random-Qwen2VLForConditionalGeneration")
    processor.save_pretrained(tmp_path)
    loaded = Qwen2VLProcessor.from_pretrained(tmp_path)
    image = torch.zeros(3, 56, 56, dtype=torch.uint8)
    text = ["<|vision_start|><|image_pad|><|vision_end|>a cat"]
    before = processor(text=text, images=[image], return_tensors="pt")
    after = loaded(text=text, images=[image], return_tensors="pt")
    assert before.input_ids.tolist() == after.input_ids.tolist() and before.input_ids.shape[1] > 10
    assert torch.equal(before.pixel_values, after.pixel_values)


def test_the_checkouts_source_comes_first():
    import os

    first = os.environ["PYTHONPATH"].split(os.pathsep)[0]
    assert first == os.path.join(os.getcwd(), "src") and os.path.isdir(os.path.join(first, "diffusers")), first


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
    assert "| standin/test_standin.py::test_qwen_vl_processor_saves_and_loads_back | passed | passed |" in text
    assert "| standin/test_standin.py::test_the_checkouts_source_comes_first | failed | failed |" in text  # no src/
    assert "| standin/test_standin.py::test_only_stock_passes | passed | failed | AssertionError: runs on jax" in text
    assert "| standin/test_standin.py::test_needs_an_accelerator | skipped | passed |" in text
    assert "jax: 1 tests that pass on stock cpu do not pass here" in text
    assert "jax: 0 tests that stock skips on cpu fail here (0 skipped here too)" in text


def test_kept_reports_are_read_instead_of_rerun_and_a_new_selection_runs(tmp_path):
    pipelines = tmp_path / "tests" / "pipelines" / "standin"
    pipelines.mkdir(parents=True)
    test_file = pipelines / "test_standin.py"
    test_file.write_text(textwrap.dedent(TEST_FILE))
    reports, markdown = tmp_path / "reports", tmp_path / "table.md"
    arguments = [str(tmp_path), "--files", "standin/test_standin.py", "--reports", str(reports)]
    assert conformance.main([*arguments, "--devices", "cpu"]) == 0
    assert sorted(path.name for path in reports.iterdir()) == ["standin__test_standin.py.cpu.xml"]
    # the file changes: a kept run is what the table shows, a run not kept yet sees the change
    test_file.write_text(textwrap.dedent(TEST_FILE).replace('DEVICE == "cpu", "runs', 'DEVICE != "cpu", "runs'))
    assert conformance.main([*arguments, "--devices", "cpu", "jax", "--markdown", str(markdown)]) == 0
    text = markdown.read_text()
    assert "| standin/test_standin.py::test_only_stock_passes | passed | passed |" in text
    assert len(list(reports.iterdir())) == 2
    assert conformance.main([*arguments, "-k", "only_stock", "--markdown", str(markdown)]) == 0
    assert "| standin/test_standin.py::test_only_stock_passes | failed | passed |" in markdown.read_text()
    assert len(list(reports.iterdir())) == 4


def test_a_checkouts_own_diffusers_comes_first_on_every_device(tmp_path):
    """With ``src/diffusers`` in the checkout, both devices' runs put it first on the path (the JAX plugin imports
    diffusers before the checkout's conftest would: it tested the installed diffusers against other tests)."""
    pipelines = tmp_path / "tests" / "pipelines" / "standin"
    pipelines.mkdir(parents=True)
    (pipelines / "test_standin.py").write_text(textwrap.dedent(TEST_FILE))
    (tmp_path / "src" / "diffusers").mkdir(parents=True)  # no __init__: the installed diffusers still imports
    markdown = tmp_path / "table.md"
    arguments = ["--files", "standin/test_standin.py", "-k", "source_comes_first", "--markdown", str(markdown)]
    assert conformance.main([str(tmp_path), *arguments]) == 0
    assert (
        "| standin/test_standin.py::test_the_checkouts_source_comes_first | passed | passed |" in markdown.read_text()
    )


def test_workers_run_each_file_in_xdist_processes_and_bad_counts_are_refused(tmp_path, capsys):
    pipelines = tmp_path / "tests" / "pipelines" / "standin"
    pipelines.mkdir(parents=True)
    (pipelines / "test_workers.py").write_text(
        "import os\n\n\ndef test_in_a_worker():\n    assert os.environ.get('PYTEST_XDIST_WORKER')\n"
    )
    arguments = [str(tmp_path), "--files", "standin/test_workers.py", "--devices", "cpu"]
    markdown = tmp_path / "table.md"
    assert conformance.main([*arguments, "--workers", "2", "--markdown", str(markdown)]) == 0
    assert "| standin/test_workers.py::test_in_a_worker | passed |" in markdown.read_text()
    with pytest.raises(SystemExit):
        conformance.main([*arguments, "--workers", "0"])
    assert "--workers 0: give 1 or more processes" in capsys.readouterr().err


OLD_DISPATCH = """
import torch

BACKEND_EMPTY_CACHE = {"cpu": None, "default": None}
BACKEND_MANUAL_SEED = {"cpu": torch.manual_seed, "default": torch.manual_seed}


def dispatch(device, table, *args):  # diffusers <= 0.38: a device not in a table calls its default, even None
    if device not in table:
        return table["default"](*args)
    fn = table[device]
    return fn(*args) if callable(fn) else fn
"""


def test_the_jax_device_is_known_to_the_tests_backend_tables(tmp_path):
    """diffusers v0.38's tests raised ``TypeError`` in every ``setUp`` on the JAX device (its dispatcher called a
    ``None`` default); the plugin enters the device in their tables with each table's default."""
    pipelines = tmp_path / "tests" / "pipelines" / "standin"
    pipelines.mkdir(parents=True)
    (pipelines / "testing_utils.py").write_text(OLD_DISPATCH)
    (pipelines / "test_tables.py").write_text(
        "import os\n\nfrom testing_utils import BACKEND_EMPTY_CACHE, BACKEND_MANUAL_SEED, dispatch\n\n\n"
        "def test_setup_dispatches():\n    device = os.environ['DIFFUSERS_TEST_DEVICE']\n"
        "    assert dispatch(device, BACKEND_EMPTY_CACHE) is None\n    dispatch(device, BACKEND_MANUAL_SEED, 0)\n"
    )
    markdown = tmp_path / "table.md"
    arguments = [str(tmp_path), "--files", "standin/test_tables.py", "--markdown", str(markdown)]
    assert conformance.main(arguments) == 0
    assert "| standin/test_tables.py::test_setup_dispatches | passed | passed |" in markdown.read_text()
