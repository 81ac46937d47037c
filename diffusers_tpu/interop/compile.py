"""Compile a module method with jax.jit, and account for compilations.

``jit_method(module, "forward", ...)`` installs an instance attribute that shadows the class method, so the
module stays the same object (its config, hooks and cache contexts keep working) while every call runs one
compiled XLA program per (non-tensor arguments, input shapes). Weights are arguments of the program, never
constants baked into it, so sharded weights stay sharded and a dtype change just retraces.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
from collections.abc import Callable

import jax
import jax.numpy as jnp
import torch
import torch.utils._pytree as pytree
from torch.nn.utils.stateless import _reparametrize_module

from . import compat
from .backend import is_jax_tensor, to_jax_array, wrap

logger = logging.getLogger(__name__)

class Rebuilt:
    """A program argument standing for a weight that the program rebuilds next to its use (``rebuild()``, traced):
    a layer above stores weights in a compact form (``runtime.quantize``: int8 values and scales) and subclasses
    this, so XLA fuses the rebuild into the matmul that reads it."""

    def rebuild(self) -> jax.Array:
        raise NotImplementedError


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
        return gathered(self.array[self.index], self.sharding)


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
    """A layer sliced out of a stack, constrained to the sharding it is used with (None: as stored)."""
    return layer if sharding is None else jax.lax.with_sharding_constraint(layer, sharding)


def expand_stacked(state: dict) -> dict:
    """``state`` with every ``Stacked`` entry replaced by its layers, each a ``LayerOf`` (raw, for trace hooks)."""
    expanded = {}
    for key, value in state.items():
        if isinstance(value, Stacked):
            expanded.update({name: LayerOf(value.array, i, value.layer_sharding) for i, name in enumerate(value.names)})
        else:
            expanded[key] = value
    return expanded


class Retrace(Exception):
    """Raised inside a trace by a ``trace_hook`` that cannot keep the stock meaning: the program is traced again
    without the hook."""


_BACKEND_COMPILE = "/jax/core/compile/backend_compile_duration"  # fires for persistent-cache loads too
_CACHE_HIT = "/jax/compilation_cache/cache_hits"
_COMPILE_PHASES = (_BACKEND_COMPILE, "/jax/core/compile/jaxpr_trace_duration", "/jax/core/compile/jaxpr_to_mlir_module_duration")


@dataclasses.dataclass(eq=False)  # identity: nested logs with equal counts must stay distinct in _open_logs
class CompileLog:
    """What JAX compiled while the log was open.

    ``compilations``: XLA programs obtained for new shapes or code (built, or loaded from the persistent
    cache — ``cache_hits`` of them); a warm call has none. ``seconds``: tracing, lowering and compiling.
    """

    compilations: int = 0
    cache_hits: int = 0
    seconds: float = 0.0


_open_logs: list[CompileLog] = []
_listener_lock = threading.Lock()
_listening = False


def _on_event(event: str, **_) -> None:
    if event == _CACHE_HIT:
        for log in list(_open_logs):
            log.cache_hits += 1


def _on_duration(event: str, duration: float, **_) -> None:
    if event not in _COMPILE_PHASES:
        return
    for log in list(_open_logs):
        log.seconds += duration
        if event == _BACKEND_COMPILE:
            log.compilations += 1


@contextlib.contextmanager
def compile_log():
    """Count compilations inside the block (nested logs all count)."""
    global _listening
    with _listener_lock:
        if not _listening:
            jax.monitoring.register_event_duration_secs_listener(_on_duration)
            jax.monitoring.register_event_listener(_on_event)
            _listening = True
    log = CompileLog()
    _open_logs.append(log)
    try:
        yield log
    finally:
        _open_logs.remove(log)


class _TensorSlot:
    """Marks where a tensor sits among flattened arguments or outputs."""


_TENSOR = _TensorSlot()


class _Program:
    """One jitted program for one structure of non-tensor arguments."""

    def __init__(self, module, method: Callable, spec, static, compute_dtype=None, donate: int | None = None,
                 extras=None, trace_hook=None):
        self.out_spec = None
        self.out_static = None
        self.donate = donate
        self.trace_hook = trace_hook

        def prepare(value):
            if isinstance(value, Rebuilt):  # int8 weights rebuilt next to their matmuls
                value = value.rebuild()
            if compute_dtype is not None and jnp.issubdtype(value.dtype, jnp.floating):
                value = value.astype(compute_dtype)  # stored in one dtype, computed in another: XLA fuses the cast
            return value

        def traced(state: dict, dynamic: list, donated: list, extra: list):
            dynamic = list(dynamic) + list(donated)
            raw_state = expand_stacked(state)
            state = {k: prepare(materialized(v)) for k, v in raw_state.items()}
            if compute_dtype is not None:
                dynamic = [x.astype(compute_dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x for x in dynamic]
            arrays = iter(dynamic)
            leaves = [wrap(next(arrays)) if s is _TENSOR else s for s in static]
            args, kwargs = pytree.tree_unflatten(leaves, spec)
            lists = _argument_lists(args, kwargs)
            before = {key: list(value) for key, value in lists.items()}
            weights = {name: wrap(value) for name, value in state.items()}
            bound = extras.bound(extra) if extras is not None else contextlib.nullcontext()
            token = compat.tracing.set(True)  # library code takes its compile-friendly paths
            state_before = _python_state(module)
            hook = self.trace_hook(module, raw_state, prepare) if self.trace_hook else contextlib.nullcontext()
            try:
                with torch.no_grad(), _reparametrize_module(module, weights), bound, hook as finish:
                    out = method(*args, **kwargs)
                    if finish is not None:
                        finish(out)
            finally:
                compat.tracing.reset(token)
                _forget_traced_caches(state_before)
            # a list argument the method changed (a feature cache filled in place) is written back by the caller
            changed = {key: value for key, value in lists.items()
                       if len(value) != len(before[key]) or any(a is not b for a, b in zip(value, before[key]))}
            out_leaves, self.out_spec = pytree.tree_flatten((out, changed))
            self.out_static = [_TENSOR if isinstance(x, torch.Tensor) else x for x in out_leaves]
            return [to_jax_array(x) for x in out_leaves if isinstance(x, torch.Tensor)]

        # donated tensor arguments' buffers may be reused for the outputs (a carried cache updated in place)
        self.jitted = jax.jit(traced, donate_argnums=(2,) if donate is not None else ())

    def __call__(self, state: dict, dynamic: list, extra: list = ()):
        cut = len(dynamic) if self.donate is None else self.donate
        return self.without_hook_if_needed(self.jitted, state, dynamic[:cut], dynamic[cut:], list(extra))

    def without_hook_if_needed(self, run, *args):
        """``run(*args)`` (a call or a lowering), traced again without the trace hook if it raised ``Retrace``."""
        try:
            return run(*args)
        except Retrace as reason:
            if self.trace_hook is None:
                raise
            logger.info("traced again without %s: %s", getattr(self.trace_hook, "__name__", "the hook"), reason)
            self.trace_hook = None
            return run(*args)

    def rebuild(self, arrays, args=(), kwargs=None):
        it = iter(arrays)
        leaves = [wrap(next(it)) if s is _TENSOR else s for s in self.out_static]
        out, changed = pytree.tree_unflatten(leaves, self.out_spec)
        callers = _argument_lists(args, kwargs or {})
        for key, contents in changed.items():
            callers[key][:] = contents
        return out


def _python_state(module) -> list:
    """Every module's attributes, and those of the plain objects they hold (Z-Image's ``RopeEmbedder``)."""
    owners = []
    for sub in module.modules():
        owners.append(sub)
        owners += [v for v in vars(sub).values() if hasattr(v, "__dict__") and not isinstance(
            v, (torch.nn.Module, torch.Tensor, type)) and type(v).__module__.split(".")[0] in ("diffusers", "transformers")]
    return [(owner, dict(vars(owner))) for owner in owners]


def _holds_tracer(value) -> bool:
    leaves = pytree.tree_leaves(value) if isinstance(value, (list, tuple, dict)) else [value]
    return any(isinstance(x, torch.Tensor) and hasattr(x, "_elem") and isinstance(x._elem, jax.core.Tracer)
               for x in leaves)


def _forget_traced_caches(state: list) -> None:
    """Model code that caches tensors on itself during a forward (rotary tables computed on first use) would keep
    this trace's tracers and hand them to a later program: those attributes go back to what they were."""
    for owner, before in state:
        for name, value in list(vars(owner).items()):
            if before.get(name, _MISSING) is not value and _holds_tracer(value):
                if name in before:
                    setattr(owner, name, before[name])
                else:
                    delattr(owner, name)


_MISSING = object()


def _argument_lists(args, kwargs) -> dict:
    """The list-valued arguments of a call, keyed by position or name."""
    found = {i: a for i, a in enumerate(args) if type(a) is list}
    found.update({k: v for k, v in kwargs.items() if type(v) is list})
    return found


def compiled_method(module: torch.nn.Module, name: str, **options) -> Callable:
    """A compiled version of ``module.<name>``, meant to be installed as an instance attribute."""
    return compiled_function(module, getattr(module, name), **options)


def compiled_function(
    module: torch.nn.Module,
    method: Callable,
    *,
    state: Callable[[], dict],
    activate: Callable[[], contextlib.AbstractContextManager],
    place_input: Callable[[jax.Array], jax.Array] = lambda a: a,
    compute_dtype=None,
    donate: int | None = None,
    extras=None,
    trace_hook=None,
) -> Callable:
    """A compiled version of ``method``, which runs torch code using ``module``'s weights.

    ``state()`` returns the module's current weights as {qualified name: jax.Array} (they become program
    arguments); ``activate()`` is the context calls run in (torchax environment, mesh, attention settings);
    ``place_input`` shards each tensor argument before the call (e.g. the batch over ``dp``). One program is
    compiled per structure of non-tensor arguments and input shapes. ``extras`` feeds module state that is not a
    weight into the program: ``extras.key()`` (hashable: part of the program key), ``extras.values()`` (arrays:
    program inputs) and ``extras.bound(arrays)`` (a context that installs them while tracing) — e.g. LoRA scales.
    """
    name = getattr(method, "__name__", "function")
    programs: dict = {}

    def compiled(*args, **kwargs):
        with activate():
            leaves, spec = pytree.tree_flatten((args, kwargs))
            static = tuple(_TENSOR if isinstance(x, torch.Tensor) else x for x in leaves)
            # Shapes are part of the key: an output's structure may depend on them (the Wan VAE's feature cache
            # holds "Rep" markers or tensors depending on the frame count), and each program keeps its own.
            shapes = tuple((tuple(x.shape), x.dtype) for x in leaves if isinstance(x, torch.Tensor))
            key = (spec, static, shapes, extras.key() if extras is not None else None)
            try:
                program = programs.get(key)
            except TypeError:
                raise TypeError(
                    f"{type(module).__name__}.{name} on JAX takes tensors and hashable values (numbers, strings, "
                    f"None, tuples); got {[type(x).__name__ for x in static if x is not _TENSOR]}."
                ) from None
            if program is None:
                program = programs[key] = _Program(module, method, spec, static, compute_dtype, donate, extras,
                                                   trace_hook)
            dynamic = [place_input(to_jax_array(x)) for x in leaves if isinstance(x, torch.Tensor)]
            extra = extras.values() if extras is not None else []
            return program.rebuild(program(state(), dynamic, extra), args, kwargs)

    compiled.__wrapped__ = method
    compiled.programs = programs
    compiled.module, compiled.state, compiled.activate = module, state, activate
    compiled.place_input, compiled.compute_dtype, compiled.donate = place_input, compute_dtype, donate
    compiled.extras, compiled.trace_hook = extras, trace_hook
    return compiled


def lower(compiled, *args, **kwargs) -> jax.stages.Lowered:
    """The program ``compiled`` (from ``compiled_function``) runs for these arguments, lowered in its context
    (the runtime's exact program: same weights, placement and settings), not compiled."""
    return _lowered(compiled, args, kwargs)[0]


def lowered_output_shapes(compiled, *args, **kwargs) -> tuple[jax.stages.Lowered, object]:
    """The program ``compiled(*args, **kwargs)`` runs, lowered, and what it would return as ``meta`` tensors (shapes
    and dtypes, no data), without running it: ``plan`` lowers the next program with them (a carried cache)."""
    lowered, program = _lowered(compiled, args, kwargs)
    return lowered, _zeros(lowered, program, device="meta")


def _zeros(lowered, program, device="cpu"):
    from torchax.ops import mappings

    zeros = iter([torch.zeros(info.shape, dtype=mappings.j2t_dtype(info.dtype), device=device)
                  for info in jax.tree_util.tree_leaves(lowered.out_info)])
    out, _ = pytree.tree_unflatten([next(zeros) if s is _TENSOR else s for s in program.out_static], program.out_spec)
    return out


def _abstract(value) -> jax.ShapeDtypeStruct:
    """A tensor argument's shape and dtype as the program takes it (64-bit host types as 32-bit, as
    ``to_jax_array`` converts them), without moving its data: lowering needs no values."""
    if isinstance(value, jax.Array) or is_jax_tensor(value):
        array = to_jax_array(value)
        return jax.ShapeDtypeStruct(array.shape, array.dtype)
    from torchax.ops import mappings

    return jax.ShapeDtypeStruct(tuple(value.shape), jax.dtypes.canonicalize_dtype(mappings.t2j_dtype(value.dtype)))


def _lowered(compiled, args, kwargs):
    leaves, spec = pytree.tree_flatten((args, kwargs))
    static = tuple(_TENSOR if isinstance(x, torch.Tensor) else x for x in leaves)
    shapes = tuple((tuple(x.shape), x.dtype) for x in leaves if isinstance(x, torch.Tensor))
    extras = compiled.extras
    key = (spec, static, shapes, extras.key() if extras is not None else None)
    program = compiled.programs.get(key) or _Program(compiled.module, compiled.__wrapped__, spec, static,
                                                     compiled.compute_dtype, compiled.donate, extras,
                                                     compiled.trace_hook)
    # placed abstractly (``place_input`` gives a ShapeDtypeStruct its sharding): no argument is copied to devices
    dynamic = [compiled.place_input(_abstract(x)) for x in leaves if isinstance(x, torch.Tensor)]
    cut = len(dynamic) if program.donate is None else program.donate
    extra = extras.values() if extras is not None else []
    with compiled.activate():
        return program.without_hook_if_needed(program.jitted.lower, compiled.state(), dynamic[:cut], dynamic[cut:],
                                              extra), program


def memory_analysis(compiled, *args, **kwargs) -> dict:
    """XLA's memory analysis of the program ``compiled`` (from ``compiled_function``) runs for these arguments:
    bytes of arguments, outputs, outputs aliasing donated arguments, temporaries, and the resulting peak
    (arguments + outputs - aliased + temporaries)."""
    return _memory_report(lower(compiled, *args, **kwargs).compile())


def compiled_memory(lowered: jax.stages.Lowered) -> dict:
    """``memory_analysis`` of a program lowered already (``lower``): compiling needs no GIL, so a thread can."""
    return _memory_report(lowered.compile())


def lowered_zero_outputs(compiled, *args, **kwargs) -> tuple[jax.stages.Lowered, object]:
    """The program ``compiled(*args, **kwargs)`` runs, lowered (``compiled_memory`` analyses it), and what it would
    return with host zeros for every tensor (arguments it edits in place left as they are), with no device
    allocation: ``plan`` walks stock decode code through compiled methods with them."""
    lowered, program = _lowered(compiled, args, kwargs)
    return lowered, _zeros(lowered, program)


def _memory_report(executable) -> dict:
    stats = executable.memory_analysis()
    report = {"argument_bytes": stats.argument_size_in_bytes, "output_bytes": stats.output_size_in_bytes,
              "alias_bytes": stats.alias_size_in_bytes, "temp_bytes": stats.temp_size_in_bytes}
    report["peak_bytes"] = report["argument_bytes"] + report["output_bytes"] - report["alias_bytes"] + report["temp_bytes"]
    return report
