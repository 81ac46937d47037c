"""Bad input: a clear error naming the problem and the fix, before any weight moves or any compile, and the
pipeline stays usable on torch afterwards."""

import logging
import re

import diffusers
import numpy as np
import pytest
import torch

import diffusers_tpu
from diffusers_tpu.interop import backend, compile_accounting
from diffusers_tpu.runtime.attach import pipeline_runtime
from diffusers_tpu.testing import tiny
from tests.conftest import generate


@pytest.fixture(scope="module")
def pipe_and_reference():
    pipe = tiny.wan_pipeline("wan")
    return pipe, generate(pipe, output_type="np")


def assert_untouched(pipe, reference):
    assert not pipeline_runtime.is_attached(pipe)
    assert all(type(p) is torch.nn.Parameter for p in pipe.transformer.parameters())
    np.testing.assert_array_equal(generate(pipe, output_type="np"), reference)


def test_tpu_without_a_tpu(pipe_and_reference, monkeypatch):
    pipe, reference = pipe_and_reference
    monkeypatch.delenv("DIFFUSERS_TPU_PLATFORM", raising=False)
    with compile_accounting.compile_log() as log, pytest.raises(RuntimeError) as error:
        pipe.to("tpu")
    message = str(error.value)
    assert "no TPU" in message and "pipe.to('jax')" in message and "DIFFUSERS_TPU_PLATFORM" in message
    assert log.compilations == 0
    assert_untouched(pipe, reference)


def test_unknown_platform_override(pipe_and_reference, monkeypatch):
    pipe, reference = pipe_and_reference
    monkeypatch.setenv("DIFFUSERS_TPU_PLATFORM", "quantum")
    with pytest.raises(ValueError, match="DIFFUSERS_TPU_PLATFORM='quantum' is not a JAX platform"):
        pipe.to("tpu")
    assert_untouched(pipe, reference)


def test_mesh_product_differs_from_device_count(pipe_and_reference):
    pipe, reference = pipe_and_reference
    with compile_accounting.compile_log() as log, pytest.raises(ValueError) as error:
        pipe.to("jax", config=diffusers_tpu.TPUConfig(mesh={"dp": 2, "tp": 2}))
    assert "spans 4 devices but there are 1" in str(error.value)
    assert log.compilations == 0
    assert_untouched(pipe, reference)


def test_heads_not_divisible_by_tp():
    with pytest.raises(ValueError) as error:
        backend.validate_mesh_shape({"dp": 2, "tp": 4}, 8, num_heads=6)
    message = str(error.value)
    assert "6 attention heads" in message and "tp=4" in message and "[1, 2]" in message


def test_unsupported_pipeline_lists_the_supported_ones():
    """A pipeline with neither a transformer nor a UNet denoiser is refused, naming the families and both paths."""

    class VaeOnly(diffusers.DiffusionPipeline):
        def __init__(self, vae):
            super().__init__()
            self.register_modules(vae=vae)

    vae = diffusers.AutoencoderKL(block_out_channels=(8,), norm_num_groups=4, latent_channels=4)
    pipe = VaeOnly(vae)
    with pytest.raises(ValueError) as error:
        pipe.to("jax")
    message = str(error.value)
    assert "VaeOnly cannot run on JAX: it has no diffusers transformer or UNet denoiser" in message
    assert "any with a diffusers `unet` the UNet path" in message
    assert "'wan'" in message and "supported_pipelines()" in message
    assert all(type(p) is torch.nn.Parameter for p in vae.parameters())
    pipe.to("cpu")  # the stock path still works


def test_cudnn_on_a_cpu_pipeline_is_refused_before_anything_moves(pipe_and_reference):
    pipe, reference = pipe_and_reference
    with pytest.raises(ValueError, match="needs an NVIDIA GPU"):
        pipe.to("jax", config=diffusers_tpu.TPUConfig(attention="cudnn"))
    assert_untouched(pipe, reference)


def test_device_index_and_config_misuse(pipe_and_reference):
    pipe, reference = pipe_and_reference
    with pytest.raises(ValueError, match="device index is not meaningful"):
        pipe.to("jax:1")
    with pytest.raises(ValueError, match="only applies when moving a pipeline to JAX"):
        pipe.to("cpu", config=diffusers_tpu.TPUConfig())
    with pytest.raises(ValueError, match="must be a diffusers_tpu.TPUConfig"):
        pipe.to("jax", config={"mesh": {"dp": 1}})
    assert_untouched(pipe, reference)


def test_invalid_height_is_stocks_error_and_compiles_nothing(pipe_and_reference):
    pipe, reference = pipe_and_reference
    with pytest.raises(ValueError) as stock_error:
        generate(pipe, height=40, output_type="np")
    pipe.to("jax")
    try:
        generate(pipe, output_type="np")  # warm
        with compile_accounting.compile_log() as log, pytest.raises(ValueError) as error:
            generate(pipe, height=40, output_type="np")
        assert str(error.value) == str(stock_error.value)
        assert log.compilations == 0
        out = generate(pipe, output_type="np")  # still usable, still right
        assert np.abs(out - reference).max() <= 1e-4
    finally:
        pipe.to("cpu")


def test_frame_count_rounding_is_stocks(pipe_and_reference, caplog):
    pipe, _ = pipe_and_reference
    with caplog.at_level(logging.WARNING):
        stock = generate(pipe, num_frames=10, output_type="np")
    stock_warnings = [r.getMessage() for r in caplog.records if "num_frames" in r.getMessage()]
    caplog.clear()
    pipe.to("jax")
    try:
        with caplog.at_level(logging.WARNING):
            out = generate(pipe, num_frames=10, output_type="np")
        assert [r.getMessage() for r in caplog.records if "num_frames" in r.getMessage()] == stock_warnings
        assert stock_warnings and out.shape == stock.shape and out.shape[1] == 9
        assert np.abs(out - stock).max() <= 1e-4
    finally:
        pipe.to("cpu")


def test_a_pipelines_tpu_is_the_jax_path():
    """Beside TorchTPU too, whose "tpu" is a torch device (tests/interop/test_shared_device.py runs that process)."""
    assert backend.parse_device("tpu") == "tpu" and backend.parse_device("jax") == "jax"
    assert backend.parse_device("cpu") is None and backend.parse_device(torch.device("jax")) == "jax"


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(mesh={"dp": 2, "xp": 4}), "unknown axes"),
        (dict(mesh={"dp": 0}), "positive integers"),
        (dict(mesh=[2, 1, 4]), "dict of axis sizes"),
        (dict(attention="flash"), "not an attention implementation"),
        (dict(attention_kv_threshold=-1), "non-negative int"),
        (dict(dtype=torch.int8), "floating torch dtype"),
        (dict(text_encoder="gpu"), "must be one of"),
        (dict(batch_cfg="yes"), "True, False or 'auto'"),
        (dict(postprocess_on_device=1), "must be a bool"),
        (dict(compile_cache_dir=3), "must be a path"),
        (dict(attention_block_sizes=(512, 512)), "must be a diffusers_tpu.kernels.BlockSizes"),
        (dict(attention_k_smoothing="yes"), "must be a bool"),
    ],
)
def test_config_rejects_nonsense(kwargs, message):
    with pytest.raises(ValueError, match=message):
        diffusers_tpu.TPUConfig(**kwargs)


@pytest.mark.parametrize(
    "env, message",
    [
        (
            {"DIFFUSERS_TPU_NUM_PROCESSES": "2", "DIFFUSERS_TPU_PROCESS_ID": "2"},
            "must be in [0, DIFFUSERS_TPU_NUM_PROCESSES=2)",
        ),
        (
            {"DIFFUSERS_TPU_NUM_PROCESSES": "two", "DIFFUSERS_TPU_PROCESS_ID": "0"},
            "DIFFUSERS_TPU_NUM_PROCESSES='two' must be an integer",
        ),
        (
            {
                "DIFFUSERS_TPU_COORDINATOR": "localhost",
                "DIFFUSERS_TPU_NUM_PROCESSES": "2",
                "DIFFUSERS_TPU_PROCESS_ID": "0",
            },
            "must be host:port",
        ),
    ],
)
def test_bad_cluster_environment_is_named(monkeypatch, env, message):
    """A malformed multi-process environment fails with the variable and the fix, before JAX is touched."""
    from diffusers_tpu.interop import distributed, processes

    monkeypatch.setenv("DIFFUSERS_TPU_COORDINATOR", "127.0.0.1:1234")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=re.escape(message)):
        distributed.initialize_from_env()
    assert not processes.is_multi_process()


def test_late_cluster_start_says_to_import_first(monkeypatch):
    """JAX already in use (the test process): initializing a cluster now fails with what to do instead."""
    from diffusers_tpu.interop import distributed

    monkeypatch.setenv("DIFFUSERS_TPU_COORDINATOR", "127.0.0.1:1234")
    monkeypatch.setenv("DIFFUSERS_TPU_NUM_PROCESSES", "2")
    monkeypatch.setenv("DIFFUSERS_TPU_PROCESS_ID", "1")
    import jax

    jax.devices()
    with pytest.raises(RuntimeError, match="import diffusers_tpu first"):
        distributed.initialize_from_env()


def test_a_cache_path_that_cannot_be_used_is_refused_or_run_without(tmp_path, monkeypatch, caplog):
    """A compilation-cache path that is a file: ``TPUConfig`` refuses it with the fix before anything moves; one from
    ``DIFFUSERS_TPU_CACHE_DIR`` (read only at the move) leaves the run without a cache, said once."""
    import logging

    import pytest

    from diffusers_tpu import TPUConfig
    from diffusers_tpu.interop import backend
    from diffusers_tpu.testing import tiny

    path = tmp_path / "cache"
    path.write_text("a file")
    with pytest.raises(ValueError, match="is a file, not a folder: name a folder"):
        TPUConfig(compile_cache_dir=str(path))
    monkeypatch.setenv("DIFFUSERS_TPU_CACHE_DIR", str(path))
    monkeypatch.setattr(backend, "_unusable_cache_dirs", set())
    pipe = tiny.wan_pipeline("wan")
    with caplog.at_level(logging.WARNING):
        pipe.to("jax")
        out = pipe(prompt="a cat", height=32, width=32, num_frames=9, num_inference_steps=2, output_type="np")
        pipe.to("cpu")
        pipe.to("jax")
    assert out.frames.shape == (1, 9, 32, 32, 3)
    assert caplog.text.count("cannot be used") == 1 and "DIFFUSERS_TPU_CACHE_DIR" in caplog.text
    pipe.to("cpu")
