"""Schedule glue on the host: scalars and vectors between programs are computed by torch on the CPU.

Every eager op on the devices is an XLA program of its own, compiled once per process, and pipelines run many small
ones between their models: building a schedule, iterating its timesteps, ``t.expand(batch)``, sigma differences, a
VAE's per-channel statistics. An op qualifies when all its tensors are
concrete torchax tensors (or views of them) holding a scalar or a vector: at most one dimension longer than 1 and at
most ``GLUE_ELEMENTS`` values. Latents, embeddings and masks never do, at any model size, so tiny test models take
the same path as real ones. torch computes the op on the host exactly as stock does on a CPU, and the result is
placed where the op's first input was (a transfer, not a program). ``compat`` installs this in torchax's dispatch.

Random draws for the devices outside a trace are made here too (``draw``): torch on the CPU, from the caller's CPU
generator or torch's default one, so ``torch.manual_seed`` decides them and they equal stock's CPU values.
Imports nothing of the package but the private-name doors (``jax_private``, ``torch_private``, ``torchax_private``).
"""

from __future__ import annotations

import jax
import ml_dtypes
import numpy as np
import torch
from torchax.tensor import Tensor
from torchax.view import NarrowInfo, View

from . import jax_private, torch_private, torchax_private
from .torch_private import pytree

GLUE_ELEMENTS = 4096
_HOST_CONSTRUCTORS = ("zeros", "ones", "full", "arange", "linspace", "logspace", "tensor", "as_tensor", "eye")
_CAST_KEYWORDS = {"dtype", "non_blocking", "copy", "memory_format"}
NOT_GLUE = object()


def _is_glue(array) -> bool:
    return (
        not isinstance(array, jax.core.Tracer)
        and array.size <= GLUE_ELEMENTS
        and sum(d > 1 for d in array.shape) <= 1
        and (array.is_fully_addressable or array.sharding.is_fully_replicated)
    )


def _host_of(array):
    """A concrete device array as numpy (this process's copy of a replicated one)."""
    return np.asarray(array if array.is_fully_addressable else array.addressable_data(0))


def _placed(host, like) -> jax.Array:
    """A numpy array on the devices as ``like`` is: committed to its sharding, or uncommitted as it was."""
    host = np.array(host, copy=True)
    if like is None or not like.committed:
        return jax.device_put(host)
    if not like.sharding.is_fully_addressable:  # replicated over several processes: each fills its own devices
        return jax.make_array_from_callback(host.shape, like.sharding, lambda index: host[index])
    return jax.device_put(host, like.sharding)


def _glue_view_source(view):
    """The source array of a torchax view made only of slices of a scalar or vector, else None."""
    source = view.source_jax()
    if not _is_glue(source) or not all(isinstance(i, NarrowInfo) for i in view.get_transformation_chain()):
        return None
    return source


def _host_tensor(value) -> torch.Tensor | None:
    """A torchax tensor or view that is schedule glue, as a host torch tensor; else None."""
    if type(value) is torch.Tensor and value.device.type == "cpu":  # a host tensor mixed in (``compat``)
        glue = value.numel() <= GLUE_ELEMENTS and sum(d > 1 for d in value.shape) <= 1
        return value if glue else None
    if type(value) is Tensor:
        array = torchax_private.array(value)
        if not _is_glue(array):
            return None
        host = _host_of(array)
    elif isinstance(value, View) and (array := _glue_view_source(value)) is not None:
        host = _host_of(array)
        for info in value.get_transformation_chain():
            host = host[info.slices]
        host = np.asarray(host)
    else:
        return None
    if host.dtype.name == "bfloat16":
        return torch.from_numpy(host.view(np.uint16).copy()).view(torch.bfloat16)
    return torch.from_numpy(np.array(host, copy=True))


def _device_array(tensors):
    """The array behind the first torchax tensor or view among ``tensors`` (where results go), or None."""
    for value in tensors:
        if type(value) is Tensor:
            return torchax_private.array(value)
        if isinstance(value, View):
            return value.source_jax()
    return None


def _is_glue_op(func, tensors) -> bool:
    if not isinstance(func, torch_private.OpOverload) or torch.Tag.nondeterministic_seeded in func.tags:
        return False
    if any(a.alias_info is not None and a.alias_info.is_write for a in func._schema.arguments):
        return False  # in place: the devices' copy must change
    # a view op on a torchax view makes a sub-view that writes through to its source: left to torchax
    views = any(isinstance(t, View) for t in tensors)
    return not (views and any(r.alias_info is not None for r in func._schema.returns))


def _host_constructor(env, func, args, kwargs):
    """``torch.zeros(1, device=...)`` and friends made on the host (outside traces: in one they are constants)."""
    device = kwargs.get("device")
    if device is None or not torchax_private.routes_to_jax(env, device) or not jax_private.trace_state_clean():
        return NOT_GLUE
    if any(isinstance(x, torch.Tensor) for x in pytree.tree_leaves((args, kwargs))):
        return NOT_GLUE
    try:
        with torch_private.plain_torch():
            result = func(*args, **{**kwargs, "device": "cpu"})
    except Exception:
        return NOT_GLUE
    if result.numel() > GLUE_ELEMENTS or sum(d > 1 for d in result.shape) > 1:
        return NOT_GLUE
    return Tensor(_placed(host_numpy(result), None), env)


def _from_scalars(env, func, args, kwargs):
    """``torch.tensor([t0, t1, ...])`` / ``torch.Tensor([...])`` of device scalars: torch reads each with ``.item()``
    and builds the tensor on the host (from CUDA scalars too), which torchax cannot do (SVD's Euler scheduler:
    ``torch.Tensor([0.25 * sigma.log() for sigma in sigmas])``). The values are read on the host; the result is a
    host tensor, or placed on the devices when ``device`` names them."""
    leaves = [x for x in pytree.tree_leaves(args[0]) if isinstance(x, torch.Tensor)]
    if not leaves or not jax_private.trace_state_clean():
        return NOT_GLUE
    host = {id(t): _host_tensor(t) for t in leaves}
    if any(h is None or h.numel() != 1 for h in host.values()):
        return NOT_GLUE
    device = kwargs.get("device")
    on_devices = device is not None and torchax_private.routes_to_jax(env, device)
    with torch_private.plain_torch():
        data = pytree.tree_map_only(torch.Tensor, lambda t: host[id(t)].reshape(()), args[0])
        result = func(data, *args[1:], **{k: v for k, v in kwargs.items() if not (on_devices and k == "device")})
    return Tensor(_placed(host_numpy(result), None), env) if on_devices else result


_FROM_DATA = (torch.tensor, torch.as_tensor, torch.Tensor)
# float(t), int(t), bool(t) of a device scalar (``torch.Tensor([...])`` of them calls ``__float__`` on each)
_TO_PYTHON = torch_private.TENSOR_TO_PYTHON


_HOST_WRITES = (torch.Tensor.__setitem__, torch.Tensor.copy_)


def _write_into_host(func, args, kwargs):
    """``host[i] = device_value`` / ``host.copy_(device_value)``: the device values read to the host and written
    there, as torch writes CUDA values into a CPU tensor (SEGA keeps its per-step estimates in CPU tensors:
    ``self.edit_estimates[i, c] = noise_pred``); torchax cannot write into a host tensor."""
    target = args[0]
    if isinstance(target, (Tensor, View)) or target.device.type != "cpu" or not jax_private.trace_state_clean():
        return NOT_GLUE
    values = [x for x in pytree.tree_leaves((args[1:], kwargs)) if isinstance(x, (Tensor, View))]
    if not values:
        return NOT_GLUE
    host = {}
    for value in values:
        array = torchax_private.array(value) if isinstance(value, Tensor) else value.jax()
        if isinstance(array, jax.core.Tracer):
            return NOT_GLUE
        host[id(value)] = _torch_of(_host_of(array))
    with torch_private.plain_torch():
        rest = pytree.tree_map_only(torch.Tensor, lambda t: host.get(id(t), t), (args[1:], kwargs))
        return func(target, *rest[0], **rest[1])


def _torch_of(array) -> torch.Tensor:
    """A numpy array (``ml_dtypes.bfloat16`` included) as a CPU tensor of its own."""
    if array.dtype.name == "bfloat16":
        return torch.from_numpy(np.array(array).view(np.uint16)).view(torch.bfloat16)
    return torch.from_numpy(np.array(array))


def run(env, func, args, kwargs):
    """The op's result computed on the host, or ``NOT_GLUE``."""
    if func in _HOST_WRITES and args and isinstance(args[0], torch.Tensor):
        return _write_into_host(func, args, kwargs)

    if (
        func in _FROM_DATA
        and args
        and isinstance(args[0], (list, tuple))
        and (found := _from_scalars(env, func, args, kwargs)) is not NOT_GLUE
    ):
        return found
    if func in _TO_PYTHON and len(args) == 1 and not kwargs:
        host = _host_tensor(args[0])
        return func(host) if host is not None and host.numel() == 1 else NOT_GLUE
    if getattr(func, "__name__", None) in _HOST_CONSTRUCTORS and getattr(torch, func.__name__, None) is func:
        return _host_constructor(env, func, args, kwargs)
    tensors = [x for x in pytree.tree_leaves((args, kwargs)) if isinstance(x, torch.Tensor)]
    if func is torch.Tensor.to:  # a cast (``t.float()``, ``t.to(torch.bfloat16)``); a move stays torchax's
        if not all(isinstance(a, (torch.dtype, bool)) for a in args[1:]) or set(kwargs) - _CAST_KEYWORDS:
            return NOT_GLUE
    elif func is torch.ops.aten._to_copy.default:
        device = kwargs.get("device")
        if device is not None and not torchax_private.routes_to_jax(env, device):
            return NOT_GLUE  # a copy to the host is the caller's own
        kwargs = {k: v for k, v in kwargs.items() if k != "device"}
    elif not _is_glue_op(func, tensors):
        return NOT_GLUE
    like = _device_array(tensors)
    if like is None:  # host tensors only: torchax leaves those to torch
        return NOT_GLUE
    host = {id(t): _host_tensor(t) for t in tensors}
    if any(h is None for h in host.values()):
        return NOT_GLUE
    try:
        with torch_private.plain_torch():
            host_args, host_kwargs = pytree.tree_map_only(torch.Tensor, lambda t: host[id(t)], (args, kwargs))
            result = func(*host_args, **host_kwargs)
    except Exception:  # whatever torch on the CPU refuses goes to torchax as before
        return NOT_GLUE
    results = [x for x in pytree.tree_leaves(result) if isinstance(x, torch.Tensor)]
    if any(t.numel() > GLUE_ELEMENTS or t.device.type != "cpu" for t in results):
        return NOT_GLUE  # e.g. a scalar expanded to a latent's shape: that is the devices' work
    return pytree.tree_map_only(torch.Tensor, lambda t: Tensor(_placed(host_numpy(t), like), env), result)


def getitem(env, tensor, indexes):
    """``table[index_tensor]`` of a scalar or vector by glue (or host) indexes, on the host; else ``NOT_GLUE``.
    Indexing by tensors copies in torch too, so no write can go astray (slices stay torchax views)."""
    leaves = pytree.tree_leaves(indexes)
    if not any(isinstance(x, torch.Tensor) for x in leaves) or (table := _host_tensor(tensor)) is None:
        return NOT_GLUE
    moved = {id(x): _host_tensor(x) for x in leaves if isinstance(x, torch.Tensor)}
    if any(h is None for h in moved.values()):
        return NOT_GLUE
    try:
        with torch_private.plain_torch():
            result = table[pytree.tree_map_only(torch.Tensor, lambda x: moved[id(x)], indexes)]
    except Exception:  # e.g. an index out of range: torchax's own error
        return NOT_GLUE
    like = _device_array([tensor, *leaves])
    if like is None or result.numel() > GLUE_ELEMENTS:
        return NOT_GLUE
    return Tensor(_placed(host_numpy(result), like), env)


DRAWS = (torch.randn, torch.rand, torch.randint, torch.randperm)
DRAWS_LIKE = (torch.randn_like, torch.rand_like, torch.randint_like)
DRAWS_IN_PLACE = (torch.Tensor.normal_, torch.Tensor.uniform_, torch.Tensor.random_, torch.Tensor.exponential_)
RANDOM_DRAWS = frozenset(DRAWS + DRAWS_LIKE + DRAWS_IN_PLACE)


def draw(env, func, args, kwargs):
    """A random draw for the devices made by torch on the host, or ``NOT_GLUE``.

    torchax draws from its own key (``torch.manual_seed`` has no effect) and, given a CPU generator, from a key made
    of the generator's initial seed (the same values at every draw). torch on the CPU draws from the generator given,
    or the default one, and advances it: the values a CPU run of stock draws (``vae.encode(x).latent_dist.sample()``
    without a generator: I2VGen-XL). Inside a trace torchax's keys remain (a program cannot call torch)."""
    generator = kwargs.get("generator")
    if not jax_private.trace_state_clean() or (generator is not None and generator.device.type != "cpu"):
        return NOT_GLUE
    like = None
    if func in DRAWS:
        # no device: in the environment's mode a factory makes a device tensor (AnimateDiff's FreeNoise shuffles
        # frames with ``torch.randperm(n, generator=...)``: torchax's own key gave another order than stock's)
        device = kwargs.get("device")
        if device is not None and not torchax_private.routes_to_jax(env, device):
            return NOT_GLUE
    elif not args or type(args[0]) is not Tensor or isinstance(torchax_private.array(args[0]), jax.core.Tracer):
        return NOT_GLUE  # a view, or a host tensor: torchax's or torch's own
    elif (
        func in DRAWS_LIKE
        and kwargs.get("device") is not None
        and not torchax_private.routes_to_jax(env, kwargs["device"])
    ):
        return NOT_GLUE
    else:
        like = torchax_private.array(args[0])
    target = args[0] if like is not None else None
    with torch_private.plain_torch():
        host_kwargs = {k: v for k, v in kwargs.items() if k != "device"}
        if target is not None:  # only the shape and dtype of the tensor drawn like / into matter
            args = (torch.empty(like.shape, dtype=target.dtype), *args[1:])
        result = func(*args, **host_kwargs)
    array = _placed(host_numpy(result), like)
    if func in DRAWS_IN_PLACE:  # torchax's in-place ops replace the wrapped array too
        torchax_private.set_array(target, array)
        return target
    return Tensor(array, env)


def view_on_host(view):
    """A torchax view of a scalar or vector, read on the host and placed like its source; None for other views."""
    source = _glue_view_source(view)
    return None if source is None else _placed(host_numpy(_host_tensor(view)), source)


def host_numpy(tensor: torch.Tensor):
    """A private numpy copy of a CPU tensor (bfloat16 as ``ml_dtypes.bfloat16``)."""
    tensor = tensor.detach().contiguous()
    if tensor.dtype == torch.bfloat16:
        return tensor.view(torch.uint16).numpy().view(ml_dtypes.bfloat16).copy()
    return np.array(tensor.numpy(), copy=True)
