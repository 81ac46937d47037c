"""Sharded loading (``diffusers_tpu.from_pretrained``): the denoiser read slice by slice into its device shards equals
stock ``from_pretrained`` + ``.to()`` bit for bit; a damaged checkpoint is named before any device is touched."""

import json
import os

import diffusers
import numpy as np
import pytest
import torch

import diffusers_tpu
from diffusers_tpu.runtime.weights import loading
from diffusers_tpu.testing import tiny
from tests.conftest import assert_np_matches, generate


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    folder = tmp_path_factory.mktemp("wan-checkpoint")
    tiny.wan_pipeline("wan-4head").save_pretrained(folder, max_shard_size="20KB")  # several shards and an index
    return str(folder)


def _weights(module) -> dict:
    return {name: p.detach().clone() for name, p in module.state_dict().items()}


@pytest.mark.parametrize("dtype", [None, torch.bfloat16])
def test_sharded_loading_equals_stock_loading(checkpoint, dtype):
    assert len([f for f in os.listdir(os.path.join(checkpoint, "transformer")) if f.endswith(".safetensors")]) > 2
    stock = diffusers.WanPipeline.from_pretrained(checkpoint, **({"torch_dtype": dtype} if dtype else {}))
    expected = generate(stock, output_type="np") if dtype is None else None
    stock.to("jax")
    pipe = diffusers_tpu.from_pretrained(checkpoint, device="jax", torch_dtype=dtype)
    placed, reference = dict(pipe.transformer.named_parameters()), dict(stock.transformer.named_parameters())
    assert placed.keys() == reference.keys()
    for name, tensor in placed.items():
        a, b = tensor.jax(), reference[name].jax()
        assert a.dtype == b.dtype and a.sharding == b.sharding and np.array_equal(np.asarray(a), np.asarray(b)), name
    if dtype is not None:  # the model's float32 modules stay float32, as stock loading keeps them
        assert pipe.transformer.scale_shift_table.dtype == torch.float32
        assert pipe.transformer.blocks[0].attn1.to_q.weight.dtype == torch.bfloat16
    else:
        assert_np_matches(generate(pipe, output_type="np"), expected)
    pipe.to("cpu"), stock.to("cpu")
    restored, reference = _weights(pipe.transformer), _weights(stock.transformer)
    assert all(torch.equal(restored[k], reference[k]) for k in reference)


def _damaged_copy(checkpoint, tmp_path):
    import shutil

    folder = tmp_path / "copy"
    shutil.copytree(checkpoint, folder)
    return folder


def _index(folder):
    path = folder / "transformer" / "diffusion_pytorch_model.safetensors.index.json"
    return path, json.loads(path.read_text())


def test_missing_shard_is_named(checkpoint, tmp_path):
    folder = _damaged_copy(checkpoint, tmp_path)
    _, index = _index(folder)
    gone = sorted(set(index["weight_map"].values()))[1]
    os.remove(folder / "transformer" / gone)
    with pytest.raises(loading.CheckpointError, match=gone):
        diffusers_tpu.from_pretrained(str(folder), device="jax")


def test_corrupt_shard_is_named(checkpoint, tmp_path):
    folder = _damaged_copy(checkpoint, tmp_path)
    _, index = _index(folder)
    broken = folder / "transformer" / sorted(set(index["weight_map"].values()))[0]
    broken.write_bytes(broken.read_bytes()[:40])  # a truncated download
    with pytest.raises(loading.CheckpointError, match=f"{broken.name} is not a readable safetensors file"):
        diffusers_tpu.from_pretrained(str(folder), device="jax")


def test_shape_and_dtype_mismatches_are_named(checkpoint, tmp_path):
    from safetensors.torch import load_file, save_file

    folder = _damaged_copy(checkpoint, tmp_path)
    _, index = _index(folder)
    name = "blocks.0.attn1.to_q.weight"
    path = folder / "transformer" / index["weight_map"][name]
    tensors = load_file(path)
    tensors[name] = tensors[name][:, :-1].contiguous()
    save_file(tensors, path)
    with pytest.raises(loading.CheckpointError, match=rf"{name} has shape \[\d+, \d+\] in {path.name}"):
        diffusers_tpu.from_pretrained(str(folder), device="jax")
    tensors[name] = torch.zeros(
        load_file(os.path.join(checkpoint, "transformer", path.name))[name].shape, dtype=torch.int32
    )
    save_file(tensors, path)
    with pytest.raises(loading.CheckpointError, match=rf"{name} is I32 in {path.name}"):
        diffusers_tpu.from_pretrained(str(folder), device="jax")


def test_not_a_pipeline_folder_or_device(tmp_path):
    with pytest.raises(loading.CheckpointError, match="no model_index.json"):
        diffusers_tpu.from_pretrained(str(tmp_path), device="jax")
    with pytest.raises(ValueError, match="use device='tpu' or 'jax'"):
        diffusers_tpu.from_pretrained(str(tmp_path), device="cuda")


@pytest.mark.parametrize("cls", [diffusers.WanPipeline, diffusers.DiffusionPipeline])
def test_device_map_naming_a_jax_device_loads_onto_it(checkpoint, cls):
    """diffusers' ``from_pretrained(..., device_map="jax")`` (its own pipeline tests load that way): the sharded
    loader, the same video as stock loading; other device maps stay stock's."""
    expected = generate(diffusers.WanPipeline.from_pretrained(checkpoint), output_type="np")
    pipe = cls.from_pretrained(checkpoint, device_map="jax")
    assert type(pipe) is diffusers.WanPipeline and pipe.transformer.device.type == "jax"
    assert_np_matches(generate(pipe, output_type="np"), expected)
    with pytest.raises(NotImplementedError, match="not supported"):
        cls.from_pretrained(checkpoint, device_map="cuda:7")
