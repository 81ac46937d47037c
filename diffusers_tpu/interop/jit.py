"""Compile a module method with jax.jit: ``CompiledFunction``, a module method's programs by key.

``compiled_method(module, "forward", ...)`` is installed as an instance attribute that shadows the class method, so
the module stays the same object (its config, hooks and cache contexts keep working) while every call runs one
compiled XLA program per (non-tensor arguments, input shapes). Weights are arguments of the program, never
constants baked into it, so sharded weights stay sharded and a dtype change just retraces. Each program is a
``program.Program``; what was compiled is counted in ``compile_accounting``; ``program_figures`` answers the
planner's questions of a program without running it.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import logging
from collections.abc import Callable

import jax
import torch
from torchax.ops import mappings

from . import module_state, static_keys
from .backend import is_jax_tensor, to_jax_array
from .program import TENSOR, Program
from .torch_private import pytree

logger = logging.getLogger(__name__)

HOOKED = (
    "%s.%s has forward hooks on its modules (registered by the pipeline or by you): stock runs them at every "
    "call, so it runs eagerly (op by op, same result, slower) while they are registered."
)
EAGER = (
    "%s.%s keeps state between calls that a compiled program cannot carry (%s): it runs eagerly (op by op) from "
    "now on, with the same result as stock, slower."
)


_call_batch = contextvars.ContextVar("diffusers_tpu_call_batch", default=None)


def call_batch() -> int | None:
    """While a compiled call places its tensor arguments: the leading dimension of the first (a denoiser's latents:
    the batch), else None. A placement reads it to tell batch-major arguments from tables of another length."""
    return _call_batch.get()


def place_arguments(place: Callable, arrays: list) -> list:
    """``place`` applied to each of a call's tensor arguments, with ``call_batch()`` set."""
    token = _call_batch.set(arrays[0].shape[0] if arrays and len(arrays[0].shape) else None)
    try:
        return [place(array) for array in arrays]
    finally:
        _call_batch.reset(token)


def _is_tensor(value) -> bool:
    return isinstance(value, torch.Tensor)


def _by_value(static: tuple) -> tuple:
    """The non-tensor arguments as a program key: registered types by their contents (``static_keys``)."""
    return tuple(x if x is TENSOR else static_keys.key_of(x) for x in static)


@dataclasses.dataclass(frozen=True)
class _Structure:
    """A module's structure, found once at its compiled method's first call (every later call reads it)."""

    places: list  # the places holding plain objects (``module_state.places``)
    modules: list  # every module under it
    setting_owners: list  # the modules whose settings select the program (an attention processor's)


@dataclasses.dataclass(frozen=True)
class _Call:
    """One call, flattened: its arguments, the program key, and the carried attributes at their places now."""

    leaves: list
    spec: object
    static: tuple
    key: tuple  # (spec, static by value, shapes, extras, settings, carried_key, held objects)
    carried_key: tuple  # the carried attributes' signatures
    live: tuple  # (owner, name) of each carried attribute now
    values: list  # their values


def compiled_method(module: torch.nn.Module, name: str, **options) -> CompiledFunction:
    """A compiled version of ``module.<name>``, meant to be installed as an instance attribute."""
    return CompiledFunction(module, getattr(module, name), **options)


class CompiledFunction:
    """A compiled version of ``method``, which runs torch code using ``module``'s weights: one object that owns its
    programs (``Program``, one per call key), the key that picks them, their lowering and the state found to carry.

    ``state()`` returns the module's current weights as {qualified name: jax.Array} (they become program
    arguments); ``jax_context()`` is the context calls run in (torchax environment, mesh, attention settings);
    ``place_input`` shards each tensor argument before the call (e.g. the batch over ``dp``); ``place_output``, if
    given, constrains every tensor the program returns (its result, list arguments it changed, carried attributes)
    while tracing: left free, the partitioner may pick a sharding the mesh cannot name. One program is
    compiled per structure of non-tensor arguments and input shapes. ``extras`` feeds module state that is not a
    weight into the program: ``extras.key()`` (hashable: part of the program key), ``extras.values()`` (arrays:
    program inputs), ``extras.donated()`` (how many of the last the call replaces: donated) and
    ``extras.bound(arrays)`` (a context that installs them while tracing) — e.g. LoRA scales.
    ``build(lowered)`` makes each program's executable (default ``compile_now``).
    """

    def __init__(
        self,
        module: torch.nn.Module,
        method: Callable,
        *,
        state: Callable[[], dict],
        jax_context: Callable[[], contextlib.AbstractContextManager],
        place_input: Callable[[jax.Array], jax.Array] = lambda a: a,
        compute_dtype=None,
        donate: int | None = None,
        extras=None,
        trace_hook=None,
        place_output=None,
        build=None,
    ):
        self.module, self.state, self.jax_context = module, state, jax_context
        self.place_input, self.compute_dtype, self.donate = place_input, compute_dtype, donate
        self.extras, self.trace_hook, self.place_output, self.build = extras, trace_hook, place_output, build
        self.__wrapped__ = method  # what it compiles (``inspect.signature`` and unwrapping see through)
        self.__name__ = self.name = getattr(method, "__name__", "function")
        self.programs: dict = {}
        # (owner, attribute) found to carry state from one call to the next (``module_state``); a held object's
        # owner is its ``Place``
        self.carried: list = []
        self.held: _Structure | None = None  # the module's structure, found at the first call
        self.caches: set = set()  # (id(owner), attribute) found to be caches: dropped after each trace
        self.eager: list = []  # the reason, once state was found that no program can carry: then it runs eagerly
        self.traced_hooks: set = set()  # hooks a trace itself registered (transformers' output capture)
        self.hooked = False  # warned that registered hooks make it run eagerly

    def __repr__(self) -> str:
        return f"<compiled {type(self.module).__name__}.{self.name}: {len(self.programs)} programs>"

    def __call__(self, *args, **kwargs):
        # One frame from the caller to the executable (the project keeps at most five between stock code and any
        # compiled program): the steady path is inline; building, state discovery and eager fallbacks branch off.
        with self.jax_context():
            if self.eager:
                return self.__wrapped__(*args, **kwargs)
            self._hold()
            hooks = module_state.hooks(self.held.modules)
            if hooks - self.traced_hooks:  # each call must run them, as stock does: eagerly while they are registered
                return self._run_hooked(hooks, args, kwargs)
            call = self.call_key(args, kwargs)
            program = self._program_for(call)
            program.carried = call.live  # the objects now at the carried places
            # ``map``, not a comprehension: on Python 3.11 a comprehension is one more frame above an eager view op
            tensors = list(map(to_jax_array, filter(_is_tensor, call.leaves)))
            dynamic = place_arguments(self.place_input, tensors)
            carried_in = list(map(to_jax_array, filter(_is_tensor, call.values)))
            extra = self.extras.values() if self.extras is not None else []
            weights = self.state()
            arguments = program.arguments(weights, dynamic, extra, carried_in)
            traces = program.executable is None  # this call traces it
            try:
                arrays = program.prepare(arguments)
                if arrays is None and program.varying:
                    arrays = program.dispatched(arguments)
                elif arrays is None:
                    try:
                        arrays = program.executable(*arguments)
                    except (TypeError, ValueError) as error:
                        arrays = program.dispatched(arguments, error)
            except module_state.Uncarriable as reason:
                del self.programs[call.key]
                what = f"attributes {list(reason.args[0])} left holding containers of tensors"
                return self._run_eagerly(what, args, kwargs)
            finally:
                if traces:  # only a trace registers hooks of its own
                    self.traced_hooks.update(module_state.hooks(self.held.modules) - hooks)
            if program.discovered is not None:  # traced in this call: what it assigned
                found = [entry for entry in program.discovered if (id(entry[0]), entry[1]) not in self.caches]
                program.discovered = None
                if found and self.donate is None:
                    inputs = (weights, dynamic, extra, carried_in)
                    return self._state_found(program, call.key, found, inputs, arrays, args, kwargs)
            return program.rebuild(arrays, args, kwargs)

    def _run_hooked(self, hooks, args, kwargs):
        if not self.hooked:
            self.hooked = True
            logger.warning(HOOKED, type(self.module).__name__, self.name)
        return self.__wrapped__(*args, **kwargs)

    def _hold(self) -> None:
        """The module's structure, found once at the first call (every later call reads it)."""
        if self.held is None:
            modules = list(self.module.modules())
            self.held = _Structure(module_state.places(self.module), modules, module_state.setting_owners(modules))

    def _program_for(self, call: _Call) -> Program:
        """The program of ``call``'s key, made (not yet traced) at its first call."""
        try:
            program = self.programs.get(call.key)
        except TypeError:
            raise TypeError(
                f"{type(self.module).__name__}.{self.name} on JAX takes tensors and hashable values (numbers, "
                f"strings, None, tuples); got {[type(x).__name__ for x in call.static if x is not TENSOR]}."
            ) from None
        if program is None:
            program = self.programs[call.key] = self._new_program(call.spec, call.static, call.live, call.carried_key)
        return program

    def _new_program(self, spec, static, live, carried_key) -> Program:
        return Program(
            self.module,
            self.__wrapped__,
            spec,
            static,
            self.compute_dtype,
            self.donate,
            self.extras,
            self.trace_hook,
            live,
            carried_key,
            self.place_output,
            self.build,
        )

    def _state_found(self, program, key, found, inputs, arrays, args, kwargs):
        """Attributes a trace assigned: caches (dropped), state a program carries (the call runs again carrying
        it), or state no program can carry (eager from now on): ``module_state.settle``."""
        carried, eager = module_state.settle(program, found, inputs, self.held.places, self.caches)
        if eager is not None:
            self.eager.append(eager.reason)
            logger.warning(EAGER, type(self.module).__name__, self.name, eager.reason)
            return program.rebuild(arrays, args, kwargs) if eager.keep_result else self.__wrapped__(*args, **kwargs)
        if carried:  # this run could not leave the state behind: run the call again, carrying it
            logger.info(
                "%s.%s keeps state between calls (%s): carried through its programs",
                type(self.module).__name__,
                self.name,
                ", ".join(f"{type(owner).__name__}.{attribute}" for owner, attribute in carried),
            )
            self.carried.extend(carried)
            del self.programs[key]
            return self(*args, **kwargs)
        return program.rebuild(arrays, args, kwargs)

    def _run_eagerly(self, reason: str, args, kwargs):
        self.eager.append(reason)
        logger.warning(EAGER, type(self.module).__name__, self.name, reason)
        return self.__wrapped__(*args, **kwargs)

    def call_key(self, args, kwargs):
        """A call's ``_Call``: its flattened arguments, the program key, the carried attributes at their places now
        (``live``: (owner, name)) and their values."""
        leaves, spec = pytree.tree_flatten((args, kwargs))
        static = tuple(TENSOR if isinstance(x, torch.Tensor) else x for x in leaves)
        # Shapes are part of the key: an output's structure may depend on them (the Wan VAE's feature cache holds
        # "Rep" markers or tensors depending on the frame count), and each program keeps its own.
        shapes = tuple((tuple(x.shape), x.dtype) for x in leaves if isinstance(x, torch.Tensor))
        self._hold()
        live = tuple((module_state.current(owner), attribute) for owner, attribute in self.carried)
        values = [vars(owner).get(attribute, module_state.MISSING) for owner, attribute in live]
        carried_key = tuple(module_state.signature(value) for value in values)
        key = (
            spec,
            _by_value(static),
            shapes,
            self.extras.key() if self.extras is not None else None,
            module_state.settings_key(self.held.setting_owners),
            carried_key,
            module_state.held_key(self.held.places),
        )
        return _Call(leaves, spec, static, key, carried_key, live, values)

    def lowered(self, args, kwargs) -> tuple[jax.stages.Lowered, Program]:
        """The program this call runs, lowered in its context (the runtime's exact program: same weights, placement
        and settings), not compiled; tensor arguments taken abstractly (no data moves)."""
        call = self.call_key(args, kwargs)
        program = self.programs.get(call.key) or self._new_program(call.spec, call.static, call.live, call.carried_key)
        program.carried = call.live
        carried_in = [_abstract(value) for value in call.values if isinstance(value, torch.Tensor)]
        # placed abstractly (``place_input`` gives a ShapeDtypeStruct its sharding): no argument is copied to devices
        dynamic = place_arguments(self.place_input, [_abstract(x) for x in call.leaves if isinstance(x, torch.Tensor)])
        extra = self.extras.values() if self.extras is not None else []
        with self.jax_context():
            lowered = program.without_hook_if_needed(
                program.jitted.lower, *program.arguments(self.state(), dynamic, extra, carried_in)
            )
        return lowered, program


def _abstract(value) -> jax.ShapeDtypeStruct:
    """A tensor argument's shape and dtype as the program takes it (64-bit host types as 32-bit, as
    ``to_jax_array`` converts them), without moving its data: lowering needs no values."""
    if isinstance(value, jax.Array) or is_jax_tensor(value):
        array = to_jax_array(value)
        return jax.ShapeDtypeStruct(array.shape, array.dtype)

    return jax.ShapeDtypeStruct(tuple(value.shape), jax.dtypes.canonicalize_dtype(mappings.t2j_dtype(value.dtype)))
