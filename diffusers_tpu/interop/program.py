"""One traced program of a compiled method: its jitted function, the module state it carries between calls, its
outputs' structure, and the executable its calls run (``jit.CompiledFunction`` holds one per key)."""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Callable
from concurrent.futures import Future

import jax
import jax.numpy as jnp
import torch

from . import compile_only, module_state, torch_private
from .backend import to_jax_array, wrap
from .compat import torch_itself
from .compile_accounting import compile_now
from .torch_private import pytree
from .weights import Rebuilt, expand_stacked, materialized

logger = logging.getLogger(__name__)


class Retrace(Exception):
    """Raised inside a trace by a ``trace_hook`` that cannot keep the stock meaning: the program is traced again
    without the hook."""


# what ``jax.stages.Compiled`` raises when called with arguments it was not built for
ARGUMENTS_CHANGED = re.compile(r"compiled for input shardings|Argument types differ|input pytree does not match")


class _TensorSlot:
    """Marks where a tensor sits among flattened arguments or outputs."""


TENSOR = _TensorSlot()
CARRIED_TENSOR = _TensorSlot()  # a carried attribute left holding a tensor: the program's next output


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
        self.extras = extras
        self.trace_hook = trace_hook
        # attributes carried between calls (``module_state``): a tensor's value is an input, what the method leaves an
        # output; ``carried_post`` (from the trace) says, per attribute, "tensor" or the plain value it is left with
        self.carried, self.carried_post = tuple(carried), None
        self.carried_tensor = [key[0] == "tensor" for key in carried_key]
        # [(owner, name, kind)] assigned during the trace and not carried: classified by the caller
        self.discovered = None
        self.report = None  # analysis: [(owner, name)] whose post-trace tensors the trace returns instead
        self.report_reassigned = set()  # analysis: (id(owner), name) the analysis trace assigned again

        def prepare(value):
            if isinstance(value, Rebuilt):  # int8 weights rebuilt next to their matmuls
                value = value.rebuild()
            if compute_dtype is not None and jnp.issubdtype(value.dtype, jnp.floating):
                value = value.astype(compute_dtype)  # stored in one dtype, computed in another: XLA fuses the cast
            return value

        def traced(state: dict, dynamic: list, donated: list, extra: list, carried_in: list = (), spent: list = ()):
            dynamic, extra = list(dynamic) + list(donated), list(extra) + list(spent)
            raw_state = expand_stacked(state)
            state = {k: prepare(materialized(v)) for k, v in raw_state.items()}
            if compute_dtype is not None:
                dynamic = [x.astype(compute_dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x for x in dynamic]
            arrays = iter(dynamic)
            leaves = [wrap(next(arrays)) if s is TENSOR else s for s in static]
            args, kwargs = pytree.tree_unflatten(leaves, spec)
            lists = argument_lists(args, kwargs)
            before = {key: list(value) for key, value in lists.items()}
            weights = {name: wrap(value) for name, value in state.items()}
            bound = extras.bound(extra) if extras is not None else contextlib.nullcontext()
            token = torch_itself.tracing.set(True)  # library code takes its compile-friendly paths
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
                torch_itself.tracing.reset(token)
                # traced values (and carried attributes) go back: the caller sets state; plain values a trace assigns
                # stay (a one-time set-up, e.g. transformers' output-capturing hooks flag) unless this is an analysis
                reassigned = module_state.changes(attributes)
                module_state.restore(
                    reassigned
                    if self.report is not None
                    else [
                        (owner, name, before)
                        for owner, name, before in reassigned
                        if (id(owner), name) in frozenset((id(o), n) for o, n in self.carried)
                        or module_state.kind(vars(owner).get(name, module_state.MISSING)) in ("tensor", "container")
                    ]
                )
            if self.report is not None:  # ``state_dependence``: the reported attributes' tensors, per attribute
                self.report_reassigned = {(id(owner), name) for owner, name, *_ in assigned}
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
            self.carried_post = [CARRIED_TENSOR if isinstance(value, torch.Tensor) else value for value in post]
            # a list argument the method changed (a feature cache filled in place) is written back by the caller
            edited_lists = {
                key: value
                for key, value in lists.items()
                if len(value) != len(before[key]) or any(a is not b for a, b in zip(value, before[key]))
            }
            out_leaves, self.out_spec = pytree.tree_flatten((out, edited_lists))
            self.out_static = [TENSOR if isinstance(x, torch.Tensor) else x for x in out_leaves]
            placed = place_output or (lambda tensor: tensor)
            return [to_jax_array(placed(x)) for x in out_leaves if isinstance(x, torch.Tensor)] + [
                to_jax_array(placed(value)) for value in post if isinstance(value, torch.Tensor)
            ]

        # donated tensor arguments' buffers may be reused for the outputs (a carried cache updated in place), and so
        # may the extras' last ``extras.donated()`` inputs (``spent``: state the call replaces)
        self.traced = traced
        self.jitted = jax.jit(
            traced,
            donate_argnums=((2,) if donate is not None else ()) + (5,),
            compiler_options=getattr(self.build, "compiler_options", None),  # the build's XLA options, if it has any
        )

    def arguments(self, state: dict, dynamic: list, extra: list = (), carried_in: list = ()) -> tuple:
        """The jitted function's arguments for one call (the tensor arguments past ``donate`` donated, and the
        extras' last ``extras.donated()``)."""
        cut = len(dynamic) if self.donate is None else self.donate
        spent = len(extra) - (self.extras.donated() if self.extras is not None else 0)
        return (state, dynamic[:cut], dynamic[cut:], list(extra)[:spent], list(carried_in), list(extra)[spent:])

    def prepare(self, arguments: tuple):
        """Build the executable at the first call (``build``). Returns None when the caller runs it
        (``executable``), or the zeros that stand for the outputs while programs are only compiled
        (``compile_only``)."""
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
        return None

    def dispatched(self, arguments: tuple, error: Exception | None = None):
        """Run through jit's own dispatch (one program per argument layout): when the executable refused arguments
        laid out unlike the ones it was built for (``error``; anything else is raised again), and from then on."""
        if error is not None:
            if not ARGUMENTS_CHANGED.search(str(error)):
                raise error
            # arguments unlike the built program's (inputs sharded otherwise by what made them, weights placed anew)
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
            any([next(flat) for _ in per_attribute])
            or (not per_attribute and (id(owner), name) in self.report_reassigned)
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
            # a hook may name a plainer one to trace with instead (a step cache's part, the blocks unrolled)
            self.trace_hook = getattr(self.trace_hook, "unrolled", None)
            return run(*args)

    def rebuild(self, arrays, args=(), kwargs=None):
        it = iter(arrays)
        leaves = [wrap(next(it)) if s is TENSOR else s for s in self.out_static]
        out, edited_lists = pytree.tree_unflatten(leaves, self.out_spec)
        callers = argument_lists(args, kwargs or {})
        for key, contents in edited_lists.items():
            callers[key][:] = contents
        for (owner, name), value in zip(self.carried, self.carried_post or ()):  # as stock torch leaves the module
            if value is module_state.MISSING:
                vars(owner).pop(name, None)
            else:
                setattr(owner, name, wrap(next(it)) if value is CARRIED_TENSOR else value)
        return out


def argument_lists(args, kwargs) -> dict:
    """The list-valued arguments of a call, keyed by position or name."""
    found = {i: a for i, a in enumerate(args) if type(a) is list}
    found.update({k: v for k, v in kwargs.items() if type(v) is list})
    return found
