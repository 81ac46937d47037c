"""The VAE's mesh: one ``spatial`` axis over the pipeline's devices (a ``batch`` axis of 1). Videos are placed on it
split along their width (else height), and the VAE's outputs are relabelled onto the pipeline's mesh."""

from __future__ import annotations

import jax
import torch
from jax.sharding import NamedSharding, PartitionSpec

from .backend import is_jax_tensor, wrap
from .sharding import constrain
from .torch_private import pytree


def spatial_spec(shape, devices: int) -> tuple:
    """A ``[B, C, T, H, W]`` video's spec on a VAE mesh: width over the ``spatial`` axis when it divides, else height,
    else whole."""
    if len(shape) == 5 and shape[-1] % devices == 0:
        return (None, None, None, None, "spatial")
    if len(shape) == 5 and shape[-2] % devices == 0:
        return (None, None, None, "spatial", None)
    return ()


def spatially(tensor, mesh):
    """A video ``[B, C, T, H, W]`` constrained to its VAE mesh's spatial sharding (``spatial_spec``, as the runtime
    places VAE inputs), or whole where neither side divides: left free, the TPU partitioner may split a small
    cache entry over part of the mesh (width 2 over 2 of 4 chips), which JAX cannot name on the mesh and refuses
    when it compiles. Anything else as it is."""
    if not isinstance(tensor, torch.Tensor) or tensor.ndim != 5:
        return tensor
    return constrain(tensor, mesh, spatial_spec(tensor.shape, mesh.size) or (None,) * 5)


def onto_mesh(value, mesh):
    """A JAX tensor laid out on another mesh over the same devices (the VAE's one-axis mesh) relabelled onto ``mesh``:
    an axis spanning every device maps to all of ``mesh``'s axes (the same layout, no copy), a one-device axis to
    none. Eager torch ops that mix arrays of two meshes fail in JAX's partitioner ("IndivisibleError"), so a VAE's
    outputs join the pipeline's mesh. Objects (a latent distribution) have their tensor attributes relabelled."""
    if mesh.size == 1:
        return value

    def relabel(leaf):
        if not is_jax_tensor(leaf):
            if hasattr(leaf, "__dict__") and not isinstance(leaf, (torch.nn.Module, type)):
                for key, attribute in list(vars(leaf).items()):
                    if is_jax_tensor(attribute):
                        setattr(leaf, key, relabel(attribute))
            return leaf
        array = leaf.jax()
        sharding = getattr(array, "sharding", None)
        if not isinstance(sharding, NamedSharding) or sharding.mesh is mesh or sharding.mesh.shape == mesh.shape:
            return leaf
        if list(sharding.mesh.devices.flat) != list(mesh.devices.flat):
            return leaf
        sizes = dict(sharding.mesh.shape)

        def entry(axes):
            names = () if axes is None else (axes,) if isinstance(axes, str) else tuple(axes)
            span = 1
            for name in names:
                span *= sizes[name]
            return tuple(mesh.axis_names) if span == mesh.size > 1 else None

        spec = PartitionSpec(*(entry(axes) for axes in sharding.spec))
        return wrap(jax.device_put(array, NamedSharding(mesh, spec)))

    return pytree.tree_map(relabel, value)
