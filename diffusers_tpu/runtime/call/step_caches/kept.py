"""What a hooked layer's stock state keeps while the program route runs: views of this package's stacked arrays
(``Kept``), read back as stock's tensors only when stock code reads them (the unit route after a fallback, a user's
look). Shared by the caches that keep attention outputs (Pyramid Attention Broadcast, FasterCache)."""

from __future__ import annotations

import jax.numpy as jnp
import torch

from ....interop.backend import to_jax_array, wrap


class Kept:
    """One layer's kept output (a tensor or a container of them): a view of ``store[(site, index)][layer]``
    (``tensor()`` makes it the value stock keeps; ``shape`` and ``dtype`` for stock's ``repr``)."""

    def __init__(self, store: dict, site: str, layer: int, single: bool, kind: type):
        self.store, self.site, self.layer, self.single, self.kind = store, site, layer, single, kind
        self.count = sum(1 for key in store if key[0] == site)
        first = store[(site, 0)]
        self.shape, self.dtype = tuple(first.shape[1:]), first.dtype

    def tensor(self):
        leaves = [wrap(self.store[(self.site, index)][self.layer]) for index in range(self.count)]
        return leaves[0] if self.single else self.kind(leaves)


def real(value):
    """``value`` as stock keeps it: a ``Kept`` view read back, anything else as it is."""
    return value.tensor() if isinstance(value, Kept) else value


def stacked(views: list) -> list:
    """The layers' kept outputs, ``[layers, ...]`` per output tensor: this package's arrays when every layer's value
    is still its view of them, else stacked from stock's own tensors (the unit route ran last)."""
    if all(isinstance(v, Kept) and v.store is views[0].store and v.site == views[0].site for v in views):
        first = views[0]
        return [first.store[(first.site, index)] for index in range(first.count)]
    leaves = [[v] if isinstance(v, torch.Tensor) else list(v) for v in map(real, views)]
    return [jnp.stack([to_jax_array(layer[index]) for layer in leaves]) for index in range(len(leaves[0]))]


def structure(value) -> tuple:
    """A kept output's (number of tensors, a lone tensor?, container type): a view's, or stock's value's."""
    if isinstance(value, Kept):
        return value.count, value.single, value.kind
    if isinstance(value, torch.Tensor):
        return 1, True, tuple
    return len(value), False, type(value)
