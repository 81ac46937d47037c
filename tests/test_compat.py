"""The torchax import shim: only removed named-tensor overloads resolve, only during torchax's import."""

import pytest
import torch

from diffusers_tpu import patches


def test_torchax_imports_and_default_env_builds():
    torchax = patches.import_torchax()
    assert torchax.default_env() is not None
    if not patches._torch_has_named_overloads():
        assert "torchax-named-overloads" in patches.applied()


def test_placeholders_only_inside_the_shim():
    packet = torch.ops.aten.prod
    if patches._torch_has_named_overloads():
        pytest.skip("this torch still has named-tensor overloads: the shim is a no-op")
    with pytest.raises(AttributeError):
        packet.dim_Dimname
    with patches._tolerate_removed_named_overloads():
        assert isinstance(packet.dim_Dimname, patches._RemovedOverload)
        with pytest.raises(AttributeError):
            packet.not_an_overload  # other missing names still fail
        assert packet.dim_int is torch.ops.aten.prod.dim_int
    with pytest.raises(AttributeError):
        packet.dim_Dimname


def test_patches_are_idempotent_and_listed():
    before = patches.applied()
    patches.apply()
    assert patches.applied() == before
    assert "DiffusionPipeline.to" in before and "WanPipeline.__call__" in before
