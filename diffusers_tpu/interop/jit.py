"""Compile a module method with jax.jit, and account for compilations.

``compiled_method(module, "forward", ...)`` is installed as an instance attribute that shadows the class method, so
the module stays the same object (its config, hooks and cache contexts keep working) while every call runs one
compiled XLA program per (non-tensor arguments, input shapes). Weights are arguments of the program, never
constants baked into it, so sharded weights stay sharded and a dtype change just retraces.

Over 400 lines on purpose: the compiled method, its cache key and its compile accounting are one mechanism.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import logging
import re
import threading
from collections.abc import Callable
from concurrent.futures import Future

import jax
import jax.numpy as jnp
import torch
from torchax.ops import mappings

from . import compile_only, module_state, static_keys, torch_compat, torch_private
from .backend import is_jax_tensor, to_jax_array, wrap
from .torch_private import pytree
from .weights import Rebuilt, expand_stacked, materialized

logger = logging.getLogger(__name__)


class Retrace(Exception):
    """Raised inside a trace by a ``trace_hook`` that cannot keep the stock meaning: the program is traced again
    without the hook."""


_BACKEND_COMPILE = "/jax/core/compile/backend_compile_duration"  # fires for persistent-cache loads too
_CACHE_HIT = "/jax/compilation_cache/cache_hits"
_COMPILE_PHASES = (
    _BACKEND_COMPILE,
    "/jax/core/compile/jaxpr_trace_duration",
    "/jax/core/compile/jaxpr_to_mlir_module_duration",
)


@dataclasses.dataclass(eq=False)  # identity: nested logs with equal counts must stay distinct in _open_logs
class CompileLog:
    """What JAX compiled while the log was open.

    ``compilations``: XLA programs obtained for new shapes or code (built, or loaded from the persistent
    cache — ``cache_hits`` of them); a warm call has none. ``seconds``: tracing, lowering and compiling.
    ``background``: programs built meanwhile on a background thread (``background_compiles``: a tiered program's
    full build), not counted in the others.
    """

    compilations: int = 0
    cache_hits: int = 0
    seconds: float = 0.0
    background: int = 0


_open_logs: list[CompileLog] = []
_listener_lock = threading.Lock()
_listening = False
_this_thread = threading.local()
# Every program JAX built in this process since ``count_programs`` (``diffusers_tpu.activate``): JAX's own count, the
# eager ops torchax runs and background builds included (``background`` says how many of them ran beside the calls).
_process = CompileLog()


@contextlib.contextmanager
def background_compiles():
    """Compilations on this thread inside the block count as ``CompileLog.background``: builds that run beside the
    calls (a tiered program's full build) are not a call's compilations."""
    _this_thread.background = True
    try:
        yield
    finally:
        _this_thread.background = False


def _on_event(event: str, **_) -> None:
    if event == _CACHE_HIT:
        _this_thread.cache_hits = getattr(_this_thread, "cache_hits", 0) + 1
        _process.cache_hits += 1
    if event == _CACHE_HIT and not getattr(_this_thread, "background", False):
        for log in list(_open_logs):
            log.cache_hits += 1


def from_persistent_cache(compile_: Callable):
    """``(compile_(), whether JAX loaded it from its persistent cache)``: an executable loaded from that cache cannot
    be serialized again (XLA:CPU's lacks its compiled functions: it fails when run)."""
    _listen()
    before = getattr(_this_thread, "cache_hits", 0)
    compiled = compile_()
    return compiled, getattr(_this_thread, "cache_hits", 0) > before


def _on_duration(event: str, duration: float, **_) -> None:
    if event not in _COMPILE_PHASES:
        return
    background = getattr(_this_thread, "background", False)
    _process.seconds += duration
    _process.compilations += event == _BACKEND_COMPILE
    _process.background += background and event == _BACKEND_COMPILE
    for log in list(_open_logs):
        if background:
            log.background += event == _BACKEND_COMPILE
            continue
        log.seconds += duration
        if event == _BACKEND_COMPILE:
            log.compilations += 1


def _listen() -> None:
    global _listening
    with _listener_lock:
        if not _listening:
            jax.monitoring.register_event_duration_secs_listener(_on_duration)
            jax.monitoring.register_event_listener(_on_event)
            _listening = True


def count_programs() -> None:
    """From now on, count every program JAX builds in this process (``process_programs``); idempotent."""
    _listen()


def process_programs() -> CompileLog:
    """What JAX built in this process since ``count_programs``, as JAX counts it (a copy)."""
    return dataclasses.replace(_process)


@contextlib.contextmanager
def compile_log():
    """Count compilations inside the block (nested logs all count)."""
    _listen()
    log = CompileLog()
    _open_logs.append(log)
    try:
        yield log
    finally:
        _open_logs.remove(log)


def compile_now(lowered: jax.stages.Lowered) -> jax.stages.Compiled:
    """The default program builder: XLA's compile with its default options (the persistent cache applies)."""
    return lowered.compile()


# what ``jax.stages.Compiled`` raises when called with arguments it was not built for
_ARGUMENTS_CHANGED = re.compile(r"compiled for input shardings|Argument types differ|input pytree does not match")


class _TensorSlot:
    """Marks where a tensor sits among flattened arguments or outputs."""


TENSOR = _TensorSlot()
_CARRIED_TENSOR = _TensorSlot()  # a carried attribute left holding a tensor: the program's next output
HOOKED = (
    "%s.%s has forward hooks on its modules (registered by the pipeline or by you): stock runs them at every "
    "call, so it runs eagerly (op by op, same result, slower) while they are registered."
)
EAGER = (
    "%s.%s keeps state between calls that a compiled program cannot carry (%s): it runs eagerly (op by op) from "
    "now on, with the same result as stock, slower."
)


class Program:
    """One jitted program for one structure of non-tensor arguments."""

    def __init__(
        self,
        module,
        method: Callable,
        spec,
        static,
        compute_dtype=None,
        donate: int | None = None,
        extras=None,
        trace_hook=None,
        carried: tuple = (),
        carried_key: tuple = (),
        place_output=None,
        build=None,
    ):
        self.out_spec = None
        # how the lowered program becomes the executable the calls run (``compile_now``, or the runtime's program
        # builder: compile effort, tiers, stored executables); ``executable``: None until the first call
        self.build = build or compile_now
        self.executable = None
        self.out_info = None  # the outputs' shapes and dtypes, from the lowering
        self.varying = False  # called with arguments laid out unlike the built program's: jit dispatches
        self.out_static = None
        self.donate = donate
        self.trace_hook = trace_hook
        # attributes carried between calls (``module_state``): a tensor's value is an input, what the method leaves an
        # output; ``carried_post`` (from the trace) says, per attribute, "tensor" or the plain value it is left with
        self.carried, self.carried_post = tuple(carried), None
        self.carried_tensor = [key[0] == "tensor" for key in carried_key]
        # [(owner, name, kind)] assigned during the trace and not carried: classified by the caller
        self.discovered = None
        self.report = None  # analysis: [(owner, name)] whose post-trace tensors the trace returns instead
        self.report_changed = set()  # analysis: (id(owner), name) the analysis trace assigned again

        def prepare(value):
            if isinstance(value, Rebuilt):  # int8 weights rebuilt next to their matmuls
                value = value.rebuild()
            if compute_dtype is not None and jnp.issubdtype(value.dtype, jnp.floating):
                value = value.astype(compute_dtype)  # stored in one dtype, computed in another: XLA fuses the cast
            return value

        def traced(state: dict, dynamic: list, donated: list, extra: list, carried_in: list = ()):
            dynamic = list(dynamic) + list(donated)
            raw_state = expand_stacked(state)
            state = {k: prepare(materialized(v)) for k, v in raw_state.items()}
            if compute_dtype is not None:
                dynamic = [x.astype(compute_dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x for x in dynamic]
            arrays = iter(dynamic)
            leaves = [wrap(next(arrays)) if s is TENSOR else s for s in static]
            args, kwargs = pytree.tree_unflatten(leaves, spec)
            lists = _argument_lists(args, kwargs)
            before = {key: list(value) for key, value in lists.items()}
            weights = {name: wrap(value) for name, value in state.items()}
            bound = extras.bound(extra) if extras is not None else contextlib.nullcontext()
            token = torch_compat.tracing.set(True)  # library code takes its compile-friendly paths
            attributes = module_state.snapshot(module)
            carried_in = iter(carried_in)
            for (owner, name), is_tensor in zip(self.carried, self.carried_tensor):
                if is_tensor:
                    setattr(owner, name, wrap(next(carried_in)))
            hook = self.trace_hook(module, raw_state, prepare) if self.trace_hook else contextlib.nullcontext()
            try:
                with torch.no_grad(), torch_private.reparametrized(module, weights), bound, hook as finish:
                    out = method(*args, **kwargs)
                    if finish is not None:
                        finish(out)
                post = [vars(owner).get(name, module_state.MISSING) for owner, name in self.carried]
                reported = [vars(owner).get(name) for owner, name in self.report or ()]
                carried = frozenset((id(owner), name) for owner, name in self.carried)
                assigned = [
                    (owner, name, module_state.kind(vars(owner).get(name, module_state.MISSING)), before)
                    for owner, name, before in module_state.changes(attributes, skip=carried)
                ]
            finally:
                torch_compat.tracing.reset(token)
                # traced values (and carried attributes) go back: the caller sets state; plain values a trace assigns
                # stay (a one-time set-up, e.g. transformers' output-capturing hooks flag) unless this is an analysis
                changed = module_state.changes(attributes)
                module_state.restore(
                    changed
                    if self.report is not None
                    else [
                        (owner, name, before)
                        for owner, name, before in changed
                        if (id(owner), name) in frozenset((id(o), n) for o, n in self.carried)
                        or module_state.kind(vars(owner).get(name, module_state.MISSING)) in ("tensor", "container")
                    ]
                )
            if self.report is not None:  # ``state_dependence``: the reported attributes' tensors, per attribute
                self.report_changed = {(id(owner), name) for owner, name, *_ in assigned}
                return [
                    [to_jax_array(x) for x in pytree.tree_leaves(value) if isinstance(x, torch.Tensor)]
                    for value in reported
                ]
            self.discovered = assigned
            uncarriable = [
                name for (owner, name), value in zip(self.carried, post) if not module_state.carriable(value)
            ]
            if uncarriable:
                raise module_state.Uncarriable(uncarriable)
            self.carried_post = [_CARRIED_TENSOR if isinstance(value, torch.Tensor) else value for value in post]
            # a list argument the method changed (a feature cache filled in place) is written back by the caller
            changed = {
                key: value
                for key, value in lists.items()
                if len(value) != len(before[key]) or any(a is not b for a, b in zip(value, before[key]))
            }
            out_leaves, self.out_spec = pytree.tree_flatten((out, changed))
            self.out_static = [TENSOR if isinstance(x, torch.Tensor) else x for x in out_leaves]
            placed = place_output or (lambda tensor: tensor)
            return [to_jax_array(placed(x)) for x in out_leaves if isinstance(x, torch.Tensor)] + [
                to_jax_array(placed(value)) for value in post if isinstance(value, torch.Tensor)
            ]

        # donated tensor arguments' buffers may be reused for the outputs (a carried cache updated in place)
        self.traced = traced
        self.jitted = jax.jit(
            traced,
            donate_argnums=(2,) if donate is not None else (),
            compiler_options=getattr(self.build, "compiler_options", None),  # the build's XLA options, if it has any
        )

    def __call__(self, state: dict, dynamic: list, extra: list = (), carried_in: list = ()):
        cut = len(dynamic) if self.donate is None else self.donate
        arguments = (state, dynamic[:cut], dynamic[cut:], list(extra), list(carried_in))
        pool = compile_only.pool()
        if self.executable is None:
            lowered = self.without_hook_if_needed(self.jitted.lower, *arguments)
            self.out_info = lowered.out_info
            if pool is not None:  # built concurrently; unsharded zeros meanwhile
                self.executable = pool.submit(self.build, lowered)
                return compile_only.zeros_of(self.out_info, sharded=False)
            self.executable = self.build(lowered)
        if isinstance(self.executable, Future):
            if pool is not None:
                return compile_only.zeros_of(self.out_info, sharded=False)
            self.executable = self.executable.result()
        if compile_only.compiling_only():  # built, not run; zeros stand for the outputs
            return compile_only.zeros_of(self.executable.out_info)
        if self.varying:
            return self.without_hook_if_needed(self.jitted, *arguments)
        try:
            return self.executable(*arguments)
        except (TypeError, ValueError) as error:
            if not _ARGUMENTS_CHANGED.search(str(error)):
                raise
            # arguments unlike the built program's (inputs sharded otherwise by what made them, weights placed anew):
            # from now on jit's own dispatch, one program per argument layout, as before the build
            logger.info("a compiled program got arguments laid out otherwise: jit keeps one program per layout")
            self.varying = True
            return self.without_hook_if_needed(self.jitted, *arguments)

    def state_dependence(self, pairs: list, state: dict, dynamic: list, extra: list, carried_in: list) -> list[bool]:
        """Per attribute of ``pairs`` (assigned by the method, found in a trace), from one more trace: a tensor (or
        tensors in a container): whether the value it is left with depends on the call's tensor arguments or carried
        state (read from the jaxpr); a plain value: whether the method changes it again (a counter, not a one-time
        set-up). The module is left as it was."""
        cut = len(dynamic) if self.donate is None else self.donate
        self.report = list(pairs)
        try:
            closed, shapes = jax.make_jaxpr(
                lambda dynamic, donated, carried: self.traced(state, dynamic, donated, list(extra), carried),
                return_shape=True,
            )(dynamic[:cut], dynamic[cut:], list(carried_in))
        finally:
            self.report = None
        flat = iter(module_state.depends_on_inputs(closed, [True] * len(closed.jaxpr.invars)))
        return [
            any([next(flat) for _ in per_attribute]) or (not per_attribute and (id(owner), name) in self.report_changed)
            for (owner, name), per_attribute in zip(pairs, shapes)
        ]

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
        leaves = [wrap(next(it)) if s is TENSOR else s for s in self.out_static]
        out, changed = pytree.tree_unflatten(leaves, self.out_spec)
        callers = _argument_lists(args, kwargs or {})
        for key, contents in changed.items():
            callers[key][:] = contents
        for (owner, name), value in zip(self.carried, self.carried_post or ()):  # as stock torch leaves the module
            if value is module_state.MISSING:
                vars(owner).pop(name, None)
            else:
                setattr(owner, name, wrap(next(it)) if value is _CARRIED_TENSOR else value)
        return out


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


def _by_value(static: tuple) -> tuple:
    """The non-tensor arguments as a program key: registered types by their contents (``static_keys``)."""
    return tuple(x if x is TENSOR else static_keys.key_of(x) for x in static)


def _argument_lists(args, kwargs) -> dict:
    """The list-valued arguments of a call, keyed by position or name."""
    found = {i: a for i, a in enumerate(args) if type(a) is list}
    found.update({k: v for k, v in kwargs.items() if type(v) is list})
    return found


def compiled_method(module: torch.nn.Module, name: str, **options) -> CompiledFunction:
    """A compiled version of ``module.<name>``, meant to be installed as an instance attribute."""
    return CompiledFunction(module, getattr(module, name), **options)


class CompiledFunction:
    """A compiled version of ``method``, which runs torch code using ``module``'s weights: one object that owns its
    programs (``Program``, one per call key), the key that picks them, their lowering and the state found to carry.

    ``state()`` returns the module's current weights as {qualified name: jax.Array} (they become program
    arguments); ``activate()`` is the context calls run in (torchax environment, mesh, attention settings);
    ``place_input`` shards each tensor argument before the call (e.g. the batch over ``dp``); ``place_output``, if
    given, constrains every tensor the program returns (its result, list arguments it changed, carried attributes)
    while tracing: left free, the partitioner may pick a sharding the mesh cannot name. One program is
    compiled per structure of non-tensor arguments and input shapes. ``extras`` feeds module state that is not a
    weight into the program: ``extras.key()`` (hashable: part of the program key), ``extras.values()`` (arrays:
    program inputs) and ``extras.bound(arrays)`` (a context that installs them while tracing) — e.g. LoRA scales.
    ``build(lowered)`` makes each program's executable (default ``compile_now``).
    """

    def __init__(
        self,
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
        place_output=None,
        build=None,
    ):
        self.module, self.state, self.activate = module, state, activate
        self.place_input, self.compute_dtype, self.donate = place_input, compute_dtype, donate
        self.extras, self.trace_hook, self.place_output, self.build = extras, trace_hook, place_output, build
        self.__wrapped__ = method  # what it compiles (``inspect.signature`` and unwrapping see through)
        self.__name__ = self.name = getattr(method, "__name__", "function")
        self.programs: dict = {}
        # (owner, attribute) found to carry state from one call to the next (``module_state``); a held object's
        # owner is its ``Place``
        self.carried: list = []
        # [places holding plain objects, every module, the modules with an attention processor]: at the first call
        self.held: list = []
        self.caches: set = set()  # (id(owner), attribute) found to be caches: dropped after each trace
        self.eager: list = []  # the reason, once state was found that no program can carry: then it runs eagerly
        self.traced_hooks: set = set()  # hooks a trace itself registered (transformers' output capture)
        self.hooked = False  # warned that registered hooks make it run eagerly

    def __repr__(self) -> str:
        return f"<compiled {type(self.module).__name__}.{self.name}: {len(self.programs)} programs>"

    def __call__(self, *args, **kwargs):
        with self.activate():
            if self.eager:
                return self.__wrapped__(*args, **kwargs)
            self._hold()
            hooks = module_state.hooks(self.held[1])
            if hooks - self.traced_hooks:  # each call must run them, as stock does: eagerly while they are registered
                if not self.hooked:
                    self.hooked = True
                    logger.warning(HOOKED, type(self.module).__name__, self.name)
                return self.__wrapped__(*args, **kwargs)
            traces = len(self.programs)
            try:
                return self._compiled_call(args, kwargs)
            finally:
                if len(self.programs) != traces:  # only a trace registers hooks of its own
                    self.traced_hooks.update(module_state.hooks(self.held[1]) - hooks)

    def _hold(self) -> None:
        """The module's structure, found once at the first call (every later call reads it)."""
        if not self.held:
            modules = list(self.module.modules())
            self.held.extend((module_state.places(self.module), modules, module_state.setting_owners(modules)))

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

    def _compiled_call(self, args, kwargs):
        leaves, spec, static, key, live, values = self.call_key(args, kwargs)
        try:
            program = self.programs.get(key)
        except TypeError:
            raise TypeError(
                f"{type(self.module).__name__}.{self.name} on JAX takes tensors and hashable values (numbers, "
                f"strings, None, tuples); got {[type(x).__name__ for x in static if x is not TENSOR]}."
            ) from None
        if program is None:
            program = self.programs[key] = self._new_program(spec, static, live, key[-2])
        program.carried = live  # the objects now at the carried places
        dynamic = place_arguments(self.place_input, [to_jax_array(x) for x in leaves if isinstance(x, torch.Tensor)])
        carried_in = [to_jax_array(value) for value in values if isinstance(value, torch.Tensor)]
        extra = self.extras.values() if self.extras is not None else []
        weights = self.state()
        try:
            arrays = program(weights, dynamic, extra, carried_in)
        except module_state.Uncarriable as reason:
            del self.programs[key]
            return self._run_eagerly(
                f"attributes {list(reason.args[0])} left holding containers of tensors", args, kwargs
            )
        found = [entry for entry in program.discovered or () if (id(entry[0]), entry[1]) not in self.caches]
        program.discovered = None
        if found and self.donate is None:
            return self._state_found(program, key, found, (weights, dynamic, extra, carried_in), arrays, args, kwargs)
        return program.rebuild(arrays, args, kwargs)

    def _state_found(self, program, key, found, inputs, arrays, args, kwargs):
        """Attributes a trace assigned: caches (dropped), state a program carries (the call runs again carrying
        it), or state no program can carry (eager from now on)."""
        pairs = [(owner, attribute) for owner, attribute, *_ in found]
        is_state = program.state_dependence(pairs, *inputs)
        new_state = [
            (owner, attribute) for (owner, attribute, kind, _), yes in zip(found, is_state) if yes and kind == "tensor"
        ]
        eager_state = [
            (owner, attribute, kind, before)
            for (owner, attribute, kind, before), yes in zip(found, is_state)
            if yes and kind != "tensor"
        ]
        self.caches.update((id(owner), attribute) for (owner, attribute, *_), yes in zip(found, is_state) if not yes)
        if eager_state:  # changed on every call, or tensors in a container: no program carries that
            what = ", ".join(f"{type(o).__name__}.{a}" for o, a, *_ in eager_state)
            if not new_state and all(kind in ("value", "object") for _, _, kind, _ in eager_state):
                self.eager.append(what)  # this call's result and its plain values are stock's; eager from now on
                logger.warning(EAGER, type(self.module).__name__, self.name, what)
                return program.rebuild(arrays, args, kwargs)
            module_state.restore([(o, a, before) for o, a, _, before in eager_state])
            return self._run_eagerly(what, args, kwargs)
        if new_state:  # this run could not leave the state behind: run the call again, carrying it
            logger.info(
                "%s.%s keeps state between calls (%s): carried through its programs",
                type(self.module).__name__,
                self.name,
                ", ".join(f"{type(o).__name__}.{a}" for o, a in new_state),
            )
            held = self.held[0]
            self.carried.extend((module_state.where(owner, held), attribute) for owner, attribute in new_state)
            del self.programs[key]
            return self(*args, **kwargs)
        return program.rebuild(arrays, args, kwargs)

    def _run_eagerly(self, reason: str, args, kwargs):
        self.eager.append(reason)
        logger.warning(EAGER, type(self.module).__name__, self.name, reason)
        return self.__wrapped__(*args, **kwargs)

    def call_key(self, args, kwargs):
        """``(leaves, spec, static, key, live, values)`` of a call: the program key, the carried attributes at their
        places now (``live``: (owner, name)) and their values."""
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
            module_state.settings_key(self.held[2]),
            carried_key,
            module_state.held_key(self.held[0]),
        )
        return leaves, spec, static, key, live, values

    def lowered(self, args, kwargs) -> tuple[jax.stages.Lowered, Program]:
        """The program this call runs, lowered in its context (the runtime's exact program: same weights, placement
        and settings), not compiled; tensor arguments taken abstractly (no data moves)."""
        leaves, spec, static, key, live, values = self.call_key(args, kwargs)
        program = self.programs.get(key) or self._new_program(spec, static, live, key[-2])
        program.carried = live
        carried_in = [_abstract(value) for value in values if isinstance(value, torch.Tensor)]
        # placed abstractly (``place_input`` gives a ShapeDtypeStruct its sharding): no argument is copied to devices
        dynamic = place_arguments(self.place_input, [_abstract(x) for x in leaves if isinstance(x, torch.Tensor)])
        cut = len(dynamic) if program.donate is None else program.donate
        extra = self.extras.values() if self.extras is not None else []
        with self.activate():
            lowered = program.without_hook_if_needed(
                program.jitted.lower, self.state(), dynamic[:cut], dynamic[cut:], extra, carried_in
            )
        return lowered, program


def lower(compiled: CompiledFunction, *args, **kwargs) -> jax.stages.Lowered:
    """The program ``compiled`` runs for these arguments, lowered in its context, not compiled."""
    return compiled.lowered(args, kwargs)[0]


def lowered_output_shapes(compiled: CompiledFunction, *args, **kwargs) -> tuple[jax.stages.Lowered, object]:
    """The program ``compiled(*args, **kwargs)`` runs, lowered, and what it would return as ``meta`` tensors (shapes
    and dtypes, no data), without running it: ``plan`` lowers the next program with them (a carried cache)."""
    lowered, program = compiled.lowered(args, kwargs)
    return lowered, _zeros(lowered, program, device="meta")


def _zeros(lowered, program, device="cpu"):
    zeros = iter(
        [
            torch.zeros(info.shape, dtype=mappings.j2t_dtype(info.dtype), device=device)
            for info in jax.tree_util.tree_leaves(lowered.out_info)
        ]
    )
    out, _ = pytree.tree_unflatten([next(zeros) if s is TENSOR else s for s in program.out_static], program.out_spec)
    return out


def _abstract(value) -> jax.ShapeDtypeStruct:
    """A tensor argument's shape and dtype as the program takes it (64-bit host types as 32-bit, as
    ``to_jax_array`` converts them), without moving its data: lowering needs no values."""
    if isinstance(value, jax.Array) or is_jax_tensor(value):
        array = to_jax_array(value)
        return jax.ShapeDtypeStruct(array.shape, array.dtype)

    return jax.ShapeDtypeStruct(tuple(value.shape), jax.dtypes.canonicalize_dtype(mappings.t2j_dtype(value.dtype)))


def memory_analysis(compiled, *args, **kwargs) -> dict:
    """XLA's memory analysis of the program ``compiled`` (from ``CompiledFunction``) runs for these arguments:
    bytes of arguments, outputs, outputs aliasing donated arguments, temporaries, and the resulting peak
    (arguments + outputs - aliased + temporaries)."""
    return memory_report(lower(compiled, *args, **kwargs).compile())


def compiled_memory(lowered: jax.stages.Lowered) -> dict:
    """``memory_analysis`` of a program lowered already (``lower``): compiling needs no GIL, so a thread can."""
    return memory_report(lowered.compile())


def lowered_zero_outputs(compiled, *args, **kwargs) -> tuple[jax.stages.Lowered, object]:
    """The program ``compiled(*args, **kwargs)`` runs, lowered (``compiled_memory`` analyses it), and what it would
    return with host zeros for every tensor (arguments it edits in place left as they are), with no device
    allocation: ``plan`` walks stock decode code through compiled methods with them."""
    lowered, program = compiled.lowered(args, kwargs)
    return lowered, _zeros(lowered, program)


def memory_report(executable) -> dict:
    stats = executable.memory_analysis()
    report = {
        "argument_bytes": stats.argument_size_in_bytes,
        "output_bytes": stats.output_size_in_bytes,
        "alias_bytes": stats.alias_size_in_bytes,
        "temp_bytes": stats.temp_size_in_bytes,
    }
    report["peak_bytes"] = (
        report["argument_bytes"] + report["output_bytes"] - report["alias_bytes"] + report["temp_bytes"]
    )
    host = getattr(stats, "host_argument_size_in_bytes", 0)
    if host:  # arguments stored in host memory (``TPUConfig(weights_in_host_memory=...)``): not in the device's peak
        report["host_argument_bytes"] = host
    return report
