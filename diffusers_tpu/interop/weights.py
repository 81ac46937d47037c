"""The forms a weight takes as a program argument, and what each stands for inside the program.

A placed module's weights enter its compiled programs as arguments (``jit``): most as the placed array itself; some
in a compact or shared form the program expands next to its use — int8 values with scales (``Rebuilt``, subclassed
by ``runtime.quantize``), a narrower storage dtype (``Cast``, layerwise casting), one stacked array for a run of
identical layers (``Stacked``; inside a trace each layer is a ``LayerOf`` it), and weights stored sharded further
than they are used (``Gathered``, fully sharded weights). ``jit``, ``runtime.repeated_blocks``,
``runtime.stacked_weights`` and ``planner.plan`` read them here.
"""

from __future__ import annotations

import dataclasses

import jax


class Rebuilt:
    """A program argument standing for a weight that the program rebuilds next to its use (``rebuild()``, traced):
    a layer above stores weights in a compact form (``runtime.quantize``: int8 values and scales) and subclasses
    this, so XLA fuses the rebuild into the matmul that reads it."""

    def rebuild(self) -> jax.Array:
        raise NotImplementedError


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Cast(Rebuilt):
    """A weight stored in a narrower dtype than it computes in (diffusers' layerwise casting: float8 storage,
    bfloat16 compute): ``values`` cast to ``dtype`` where the program reads it."""

    values: jax.Array
    dtype: object = dataclasses.field(metadata=dict(static=True))

    def rebuild(self) -> jax.Array:
        return self.values.astype(self.dtype)


def rebuild_weights(state: dict) -> dict:
    """Inside a traced program: every ``Rebuilt`` weight of ``state`` as the array it stands for."""
    return {k: v.rebuild() if isinstance(v, Rebuilt) else v for k, v in state.items()}


@jax.tree_util.register_pytree_node_class
class Stacked:
    """One program argument standing for the same weight of several layers, stored as one array ``[L, ...]``
    (``runtime.stacked_weights``): ``names[i]`` is layer i's qualified name. Inside the program each layer's weight is
    ``array[i]`` (XLA drops the ones nothing reads); a ``trace_hook`` finds ``LayerOf`` markers in its raw state and
    may index the array itself (a loop over the layers: one dynamic slice per iteration, no per-layer copies).
    ``layer_sharding``: when the stack is stored sharded further than a layer is used (fully sharded weights), the
    sharding each layer is gathered to where it is read; None: a layer is used as stored."""

    def __init__(self, array, names: tuple[str, ...], layer_sharding=None):
        self.array, self.names, self.layer_sharding = array, tuple(names), layer_sharding

    def tree_flatten(self):
        return (self.array,), (self.names, self.layer_sharding)

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls(children[0], *aux)


@dataclasses.dataclass(frozen=True)
class LayerOf:
    """In a trace hook's raw state: this weight is layer ``index`` of the stacked (traced) ``array``, used with
    ``sharding`` (``Stacked.layer_sharding``)."""

    array: object
    index: int
    sharding: object = None

    def value(self):
        return gathered(jax.lax.index_in_dim(self.array, self.index, keepdims=False), self.sharding)


@jax.tree_util.register_pytree_node_class
class Gathered:
    """A program argument stored sharded further than it is used (fully sharded weights): inside the program it is
    ``array`` constrained to ``sharding``, the layout the model's rules give it."""

    def __init__(self, array, sharding):
        self.array, self.sharding = array, sharding

    def tree_flatten(self):
        return (self.array,), self.sharding

    @classmethod
    def tree_unflatten(cls, sharding, children):
        return cls(children[0], sharding)

    def value(self):
        return gathered(self.array, self.sharding)


def materialized(raw):
    """A raw state entry as the array the program computes with (a stacked layer sliced, a stored one gathered)."""
    return raw.value() if isinstance(raw, (LayerOf, Gathered)) else raw


def gathered(layer, sharding):
    """A layer sliced out of a stack, constrained to the sharding it is used with (None: as stored); one stored in
    host memory (``TPUConfig(weights_in_host_memory=True)``) is moved to the devices' memory here."""
    if sharding is None:
        return layer
    if jax.typeof(layer).memory_space == jax.memory.Space.Host:
        return jax.device_put(layer, sharding)
    return jax.lax.with_sharding_constraint(layer, sharding)


def expand_stacked(state: dict) -> dict:
    """``state`` with every ``Stacked`` entry replaced by its layers, each a ``LayerOf`` (raw, for trace hooks)."""
    expanded = {}
    for key, value in state.items():
        if isinstance(value, Stacked):
            expanded.update({name: LayerOf(value.array, i, value.layer_sharding) for i, name in enumerate(value.names)})
        else:
            expanded[key] = value
    return expanded
