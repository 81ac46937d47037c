"""What a scheduler step's trace is made of (``scheduler_steps`` runs it): the torch-function mode that turns a
counter's table lookups into the program's own index and random draws into inputs, the draws made again on the host at
every call, and the tensors a per-step program holds as constants."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import torch
from torch.overrides import TorchFunctionMode

from ...interop import host_scalars, processes, torch_private, torchax_private
from ...interop.backend import is_jax_tensor, jax_dtype, jax_to_host, to_jax_array, wrap
from ...interop.guarded_index import GuardedIndex, Guards
from ...interop.torch_private import pytree
from .scheduler_state import Uncarried


@dataclasses.dataclass
class Draw:
    """One random draw of a traced step, made again on the host at every call."""

    func: object
    args: tuple
    kwargs: dict
    like: tuple | None  # (shape, dtype) of the tensor drawn like or into
    generator: object  # the call's generator by position (int), torch's default (None), or a generator of its own
    shape: tuple
    dtype: torch.dtype


@dataclasses.dataclass
class Program:
    guards: Guards
    executable: object  # None: the method passes its inputs through (nothing to run)
    out_info: object  # its outputs' shapes, dtypes and shardings (zeros stand for them in a warm-up that runs nothing)
    state: dict  # attribute -> template
    removed: tuple
    result: tuple
    written: list  # inputs changed in place: ("state" | "arg", index, output)
    draws: list


class TraceMode(TorchFunctionMode):
    """Inside a step's trace: a counter indexing a tensor becomes the program's index (every other use of it its exact
    value), and a random draw becomes the next of ``draws`` (zeros while ``recorded`` first finds them: made from
    ``traced``, one of the program's own inputs, so that the arithmetic on them is traced too, not run op by op on
    concrete zeros, each op a program of its own, for a trace that is thrown away)."""

    def __init__(self, draws: list, recorded: list, generators: list, traced):
        super().__init__()
        self.draws, self.recorded, self.generators, self.traced = iter(draws), recorded, generators, traced

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in host_scalars.RANDOM_DRAWS:
            return self._draw(func, args, kwargs)
        if any(isinstance(x, GuardedIndex) for x in pytree.tree_leaves((args, kwargs))):
            if func is torch.Tensor.__getitem__:
                args = (args[0], traced_index(args[0], args[1]))
            args, kwargs = pytree.tree_map_only(GuardedIndex, GuardedIndex.exact, (args, kwargs))
        return func(*args, **kwargs)

    def _draw(self, func, args, kwargs):
        target = args[0] if func not in host_scalars.DRAWS else None
        rest = args[1:] if target is not None else args
        if any(isinstance(x, torch.Tensor) for x in pytree.tree_leaves((rest, kwargs))):
            raise Uncarried("random draw with tensor parameters")
        generator = kwargs.get("generator")
        slot = next((i for i, g in enumerate(self.generators) if g is generator), generator)
        like = (tuple(target.shape), target.dtype) if target is not None else None
        kept = {k: v for k, v in kwargs.items() if k not in ("generator", "device")}
        with torch_private.plain_torch():  # its shape and dtype only: nothing is drawn
            first = (torch.empty(like[0], dtype=like[1], device="meta"),) if like else ()
            meta = func(*first, *rest, **kept, **({} if like else {"device": "meta"}))
        self.recorded.append(Draw(func, tuple(rest), kept, like, slot, tuple(meta.shape), meta.dtype))
        array = next(self.draws, None)
        if array is None:
            array = jax.numpy.broadcast_to((self.traced * 0).astype(jax_dtype(meta.dtype)), meta.shape)
        if func in host_scalars.DRAWS_IN_PLACE:
            torchax_private.set_array(target, array)
            return target
        return wrap(array)


def traced_index(tensor, index):
    """A tensor's index with its counters as the program's own (a sign and a bound guard keep torch's meaning)."""
    parts = index if isinstance(index, tuple) else (index,)
    found = []
    for axis, part in enumerate(parts):
        if isinstance(part, GuardedIndex):
            size = tensor.shape[axis]
            inside = (part >= -size) if (part < 0) else (part < size)
            if not inside:  # out of range: torch's own error, from the exact value
                part = part.exact()
            else:
                part = wrap(part.traced())
        found.append(part)
    return tuple(found) if isinstance(index, tuple) else found[0]


def is_table(tensor) -> bool:
    """A schedule's table or a timestep (a scalar or a vector): a per-step program's constant."""
    return tensor.numel() <= host_scalars.GLUE_ELEMENTS and sum(d > 1 for d in tensor.shape) <= 1


def tables(tensors) -> list:
    return [t for t in tensors if is_table(t)]


def digest(tensors) -> tuple:
    """What a per-step program is specific to: its tables' and timestep's values."""
    found = []
    for tensor in tensors:
        host = np.asarray(to_jax_array(tensor)) if is_jax_tensor(tensor) else host_scalars.host_numpy(tensor)
        found.append((host.shape, host.dtype.str, hash(host.tobytes())))
    return tuple(found)


def constant_copy(tensor):
    """A per-step constant as the trace sees it: a host tensor of its own (an in-place op in the trace cannot reach the
    scheduler's), so the schedule's arithmetic on it is torch's on the CPU, as stock's, and compiles nothing."""
    if is_jax_tensor(tensor):
        return jax_to_host(to_jax_array(tensor))
    with torch_private.plain_torch():
        return tensor.clone()


def write_into(tensor, array) -> None:
    if is_jax_tensor(tensor) and torchax_private.holds_array(tensor):
        torchax_private.set_array(tensor, array)
        return
    with torch_private.plain_torch():
        tensor.copy_(jax_to_host(array, tensor.dtype))


def placed(array, like) -> jax.Array:
    """A host array (or a draw) on the devices: replicated over ``like``'s mesh, or where JAX puts it."""
    mesh = getattr(getattr(like, "sharding", None), "mesh", None)
    if mesh is None or not hasattr(mesh, "axis_names"):
        return jax.device_put(array)
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    return processes.place(np.asarray(array) if not isinstance(array, jax.Array) else array, replicated)


def draw_now(draw: Draw, generators: list) -> np.ndarray:
    """The draw made by torch on the host as stock makes it: from the call's generator, torch's default, or its own."""
    generator = generators[draw.generator] if isinstance(draw.generator, int) else draw.generator
    with torch_private.plain_torch():
        first = (torch.empty(draw.like[0], dtype=draw.like[1]),) if draw.like else ()
        result = draw.func(*first, *draw.args, **draw.kwargs, **({"generator": generator} if generator else {}))
    return host_scalars.host_numpy(result)
