"""A scheduler's Python state as a program carries it: flattened into a key and tensor leaves, rebuilt for a trace,
and read back after it as a template that a later call fills without running the Python again.

A scheduler keeps its state in plain attributes: tensors (``sigmas``, ``model_outputs``' entries, ``last_sample``),
containers of them, numbers, flags, its frozen config. ``flatten`` turns ``vars(scheduler)`` (or a call's arguments)
into a hashable spec (the program's key: shapes, dtypes, every plain value) and the tensors in order (the program's
inputs). ``Template`` records what the traced method left behind, each slot one of: a program output, an input
passed through (the caller's own tensor again), the step counter (``coef * base + offset``), or a constant.
Anything else a scheduler holds (an object with its own state, a noise sampler) is ``Uncarried``: that scheduler
keeps its eager step.
"""

from __future__ import annotations

import enum
import functools
import types

import jax
import numpy as np
import torch
from torchax.ops import mappings

from ...interop.backend import is_jax_tensor, to_jax_array
from ...interop.guarded_index import GuardedIndex
from ...interop.torch_private import pytree

COUNTER = "_step_index"  # the one counter traced as an input (``GuardedIndex``); every other value is in the key
_PLAIN = (int, float, bool, str, bytes, type(None), torch.dtype, torch.device, enum.Enum)
_BY_IDENTITY = (types.FunctionType, types.BuiltinFunctionType, type)


class Uncarried(Exception):
    """A value no program can carry (its type is named)."""


@functools.cache
def program_dtype(dtype: torch.dtype):
    """The dtype a tensor has in a program (JAX without 64-bit types: a host int64 table is int32 there)."""
    return jax.dtypes.canonicalize_dtype(mappings.t2j_dtype(dtype))


_config_keys: dict = {}  # id(config) -> (config, its key): a frozen config's key is made once


def _immutable_mapping(value) -> bool:  # diffusers' FrozenDict (the config): fixed once built
    return type(value).__name__ == "FrozenDict"


def flatten(value, leaves: list):
    """``value``'s spec (hashable); its tensors appended to ``leaves``."""
    if isinstance(value, torch.Tensor):
        leaves.append(value)
        return ("tensor", tuple(value.shape), program_dtype(value.dtype))
    if isinstance(value, torch.Generator):
        return ("generator", value.device.type)
    if isinstance(value, _PLAIN):
        return ("value", type(value), value)
    if type(value) in (list, tuple):
        return (type(value), tuple(flatten(item, leaves) for item in value))
    if type(value) is dict:
        return (dict, tuple((key, flatten(item, leaves)) for key, item in value.items()))
    if isinstance(value, np.ndarray):
        return ("numpy", value.shape, value.dtype.str, hash(value.tobytes()))
    if _immutable_mapping(value):  # by content: a deep-copied scheduler's config runs the same programs
        known = _config_keys.get(id(value))
        if known is None or known[0] is not value:
            known = _config_keys[id(value)] = (value, ("config", tuple((k, flatten(v, [])) for k, v in value.items())))
        return known[1]
    if isinstance(value, _BY_IDENTITY):
        return ("object", id(value))
    raise Uncarried(type(value).__name__)


def rebuild(value, tensors):
    """``value`` with its tensors replaced, in ``flatten``'s order, by ``next(tensors)``; containers new, the rest
    itself."""
    if isinstance(value, torch.Tensor):
        return next(tensors)
    if type(value) in (list, tuple):
        return type(value)(rebuild(item, tensors) for item in value)
    if type(value) is dict:
        return {key: rebuild(item, tensors) for key, item in value.items()}
    return value


def state_of(scheduler, methods: tuple) -> dict:
    """The attributes a program carries: all but the counter and the methods installed over the class's."""
    return {name: value for name, value in vars(scheduler).items() if name != COUNTER and name not in methods}


class Template:
    """What a trace left: ``fill(outputs, state_in, args_in, base)`` builds it for another call of the same program."""

    def __init__(self, inputs: dict, to_array):
        # id(a traced input's tensor) -> (the tensor, "state" | "arg", index, ``held`` when traced)
        self.inputs = inputs
        self.to_array = to_array  # a tensor the trace left -> its array (an output of the program)
        self.outputs: list = []  # the arrays the program returns
        self._output_of: dict = {}

    @staticmethod
    def held(tensor):
        """What an in-place op changes: a traced input's array (replaced), a per-step constant's version (a host
        tensor: torch counts its in-place writes)."""
        return to_jax_array(tensor) if is_jax_tensor(tensor) else tensor._version

    def written(self) -> list:
        """Inputs the traced method changed in place (``x.add_(...)``), as ("state" | "arg", index, output): a call
        writes the program's result into the caller's own tensor, as stock's in-place op does."""
        return [
            (kind, index, self._output(tensor))
            for tensor, kind, index, held in self.inputs.values()
            if (tensor._version != held if isinstance(held, int) else self.to_array(tensor) is not held)
        ]

    def _output(self, tensor) -> int:
        if id(tensor) not in self._output_of:
            self._output_of[id(tensor)] = len(self.outputs)
            self.outputs.append(self.to_array(tensor))
        return self._output_of[id(tensor)]

    def read(self, value):
        """``value`` (left by the trace) as a template."""
        if isinstance(value, torch.Tensor):
            passed = self.inputs.get(id(value))
            if passed is not None:  # the input itself, written into in place or not
                return ("input", passed[1], passed[2])
            return ("output", self._output(value))
        if isinstance(value, GuardedIndex):
            return ("counter", value.coef, value.offset)
        if type(value) in (list, tuple):
            return (type(value), tuple(self.read(item) for item in value))
        if type(value) is dict:
            return (dict, tuple((key, self.read(item)) for key, item in value.items()))
        if isinstance(value, torch.Generator) or isinstance(value, _PLAIN + (np.ndarray,) + _BY_IDENTITY):
            return ("constant", value)
        if _immutable_mapping(value):
            return ("constant", value)
        leaves, spec = pytree.tree_flatten(value)
        if spec.num_leaves == 1 and leaves and leaves[0] is value:  # a leaf of a type no program carries
            raise Uncarried(type(value).__name__)
        return ("tree", spec, tuple(self.read(leaf) for leaf in leaves))


def fill(template, outputs, state_in: list, args_in: list, base: int | None, wrap):
    """A template made concrete for one call: outputs wrapped as tensors, inputs the caller's own objects."""
    kind = template[0]
    if kind == "output":
        return wrap(outputs[template[1]])
    if kind == "input":
        return (state_in if template[1] == "state" else args_in)[template[2]]
    if kind == "counter":
        return template[1] * base + template[2]
    if kind == "constant":
        return template[1]
    if kind == "tree":
        return pytree.tree_unflatten(
            [fill(t, outputs, state_in, args_in, base, wrap) for t in template[2]], template[1]
        )
    if kind is dict:
        return {key: fill(t, outputs, state_in, args_in, base, wrap) for key, t in template[1]}
    return kind(fill(t, outputs, state_in, args_in, base, wrap) for t in template[1])
