"""How a compiled program is found again from the non-tensor arguments of a call: by their value.

A compiled function keys its programs on the call's non-tensor arguments. Numbers, strings and tuples key by value.
An object whose type hashes by identity (torch's ``BlockMask``, made anew by AnyFlow FAR on every call) would key a
new program on every call, each kept alive by its key: a recompilation per call and a growing cache. A type
registered here keys by what it holds instead (tensors by their bytes, functions by their code and the values they
close over): an equal argument finds the program traced with an equal one. An unregistered object still keys by
itself, which is exact (its program is only reused for that very object)."""

from __future__ import annotations

import types
from typing import Callable

import torch

_KEYS: dict[type, Callable[[object], object]] = {}


def register(kind: type, key: Callable[[object], object]) -> None:
    """Key arguments of ``kind`` (and its subclasses) by ``key(argument)``, a hashable made of their contents."""
    _KEYS[kind] = key


def key_of(value):
    """``value``'s program key: a registered type's content key, else ``value`` itself."""
    for kind, key in _KEYS.items():
        if isinstance(value, kind):
            return (kind.__qualname__, key(value))
    return value


def content_key(value):
    """A hashable standing for what ``value`` holds: tensors by shape, dtype and bytes; numbers, strings, None by
    value; sequences and dicts by their items; functions by code, defaults and closed-over values. Anything else
    by identity (the object itself), so two such values never share a key unless they are one object."""
    if isinstance(value, torch.Tensor):
        host = value.detach().cpu()
        return ("tensor", tuple(host.shape), str(host.dtype), host.contiguous().numpy().tobytes())
    if value is None or isinstance(value, (bool, int, float, str, torch.dtype, torch.device)):
        return value
    if isinstance(value, (tuple, list)):
        return (type(value).__name__, tuple(content_key(item) for item in value))
    if isinstance(value, dict):
        return ("dict", tuple(sorted(((repr(k), content_key(v)) for k, v in value.items()), key=lambda kv: kv[0])))
    if isinstance(value, types.FunctionType):
        cells = tuple(content_key(cell.cell_contents) for cell in value.__closure__ or ())
        return ("function", value.__code__, content_key(value.__defaults__), cells)
    return ("object", value)
