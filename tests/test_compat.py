"""The torch/torchax compatibility layer (``compat``) and the diffusers-level patches (``patches``)."""

import pytest
import torch

from diffusers_tpu.interop import compat
from diffusers_tpu.runtime import patches


def test_torchax_imports_and_default_env_builds():
    torchax = compat.import_torchax()
    assert torchax.default_env() is not None
    if not compat._torch_has_named_overloads():
        assert "torchax-named-overloads" in patches.applied()


def test_placeholders_only_inside_the_shim():
    packet = torch.ops.aten.prod
    if compat._torch_has_named_overloads():
        pytest.skip("this torch still has named-tensor overloads: the shim is a no-op")
    with pytest.raises(AttributeError):
        packet.dim_Dimname
    with compat._tolerate_removed_named_overloads():
        assert isinstance(packet.dim_Dimname, compat._RemovedOverload)
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


def test_type_as_returns_a_new_tensor_that_torch_checks_accept():
    import torch.nn.functional as F

    from diffusers_tpu.interop import backend
    from diffusers_tpu.interop.backend import host_to_jax, wrap

    assert "torchax Tensor.type_as" in patches.applied()
    with backend.jax_mode():
        weight = wrap(host_to_jax(torch.randn(4, 2, 3, 3).to(torch.bfloat16)))
        x = wrap(host_to_jax(torch.randn(1, 2, 5, 5)))  # float32
        y = x.type_as(weight)
        assert y is not x and y.dtype == torch.bfloat16 and x.dtype == torch.float32
        out = F.conv2d(y, weight, weight[:, 0, 0, 0])  # failed with the in-place type_as
        assert out.dtype == torch.bfloat16 and tuple(out.shape) == (1, 4, 3, 3)


def test_setitem_casts_to_the_destination_dtype_like_torch():
    import warnings

    from diffusers_tpu.interop import backend
    from diffusers_tpu.interop.backend import host_to_jax, wrap

    assert "torchax Tensor.__setitem__" in patches.applied()
    with backend.jax_mode(), warnings.catch_warnings():
        warnings.simplefilter("error")  # JAX's "will result in an error" FutureWarning must not fire
        out = wrap(host_to_jax(torch.zeros(2, 4, dtype=torch.bfloat16)))
        value = wrap(host_to_jax(torch.full((2, 2), 1.5)))  # float32
        out[..., 0::2] = value
        assert out.dtype == torch.bfloat16
        result = backend.jax_to_host(out.jax())
    expected = torch.zeros(2, 4, dtype=torch.bfloat16)
    expected[..., 0::2] = torch.full((2, 2), 1.5)
    assert torch.equal(result, expected)


INPLACE_ON_VIEWS = {
    "addcmul_": lambda v, b: v.addcmul_(-b, b, value=0.5),
    "addcdiv_": lambda v, b: v.addcdiv_(b, b + 1),
    "lerp_": lambda v, b: v.lerp_(b, 0.25),
    "zero_": lambda v, b: v.zero_(),
    "masked_fill_": lambda v, b: v.masked_fill_(b > 2.5, 7.0),
    "mul_": lambda v, b: v.mul_(b),  # one torchax handles itself: must keep working
}


@pytest.mark.parametrize("op", sorted(INPLACE_ON_VIEWS))
def test_inplace_ops_on_a_view_write_through_like_torch(op):
    """LTX-2's rotary embedding updates ``out[..., :1, :]`` with ``addcmul_``: the write must reach ``out``."""
    torchax = compat.import_torchax()
    expected = torch.arange(12.0).reshape(2, 2, 3) / 7
    INPLACE_ON_VIEWS[op](expected[..., 1:, :], torch.arange(6.0).reshape(2, 1, 3))
    with torchax.default_env():
        out = (torch.arange(12.0).reshape(2, 2, 3) / 7).to("jax")
        INPLACE_ON_VIEWS[op](out[..., 1:, :], torch.arange(6.0).reshape(2, 1, 3).to("jax"))
        got = torch.from_numpy(__import__("numpy").asarray(out.jax()))
    assert torch.allclose(got, expected, atol=1e-6), (got, expected)
