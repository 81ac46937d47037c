"""Scheduler steps as compiled programs: stock ``scheduler.step`` (and ``scale_model_input``) traced through torchax
into one XLA program per structure, its Python state carried in and out.

Eager, a UniPC step is ~130 torch ops, each dispatched on its own from the host. Here a step is traced once with the
scheduler's state as inputs (``scheduler_state``): its tensors (tables, the multistep history) are arguments, its
plain values are the program's key, and its step counter is a ``GuardedIndex``, so steps that take the same path
through the Python share a program. A later call fills the recorded template from the program's outputs: none of the
scheduler's Python runs, one program is dispatched.

- Random draws in a step (ancestral and SDE samplers, ``randn_tensor``) are made by torch on the host from the call's
  generator, as stock makes them, and enter the program as inputs: recorded in the trace, drawn anew at every call.
- A step whose Python reads a traced value (DDIM's ``if prev_timestep >= 0``) is traced again with its counter and
  timestep as constants: one program per step ("per step"), reused by every later call with the same schedule.
- A step no program can run (state of another kind, a host read of the latents) keeps stock's eager step, named once
  in the log and by ``bench`` (``eager_reason``).
"""

from __future__ import annotations

import copy
import dataclasses
import logging
from collections.abc import Callable

import jax
import numpy as np
import torch

from ...interop import compile_only
from ...interop.backend import host_to_jax, is_jax_tensor, jax_dtype, to_jax_array, wrap
from ...interop.compat import torch_itself
from ...interop.compile_accounting import compile_now
from ...interop.guarded_index import GuardedIndex, Guards
from ...interop.torch_private import pytree
from . import scheduler_state
from .scheduler_state import COUNTER, Template, Uncarried
from .scheduler_trace import (
    Program,
    TraceMode,
    constant_copy,
    digest,
    draw_now,
    is_table,
    placed,
    tables,
    write_into,
)

logger = logging.getLogger(__name__)

METHODS = ("step", "scale_model_input")
INSTALLED = (*METHODS, "set_timesteps")  # the attributes a call installs over the class's methods
GUARDED, PER_STEP = "guarded", "per step"


@dataclasses.dataclass
class Shared:
    """What every copy of a scheduler's method shares (a deep-copied scheduler runs the same programs)."""

    # key -> [Program] (guarded), (key, counter, tables) -> Program, key -> why it runs eagerly
    programs: dict = dataclasses.field(default_factory=dict)
    per_step_only: set = dataclasses.field(default_factory=set)  # keys whose Python reads a traced value
    created: set = dataclasses.field(default_factory=set)  # attributes its steps make (``ScheduleReset``)
    # a lowered program's text -> its executable: a state that differs only in what the program never reads (a flag
    # a last loop left) traces again but compiles nothing
    executables: dict = dataclasses.field(default_factory=dict)
    # lowered -> executable: the runtime's builder (``TPUConfig(programs=DIR)`` loads and stores them as the others)
    build: Callable = compile_now


class CompiledSchedulerMethod:
    """A scheduler method's programs (one per state structure and guard outcome), installed over the method during a
    pipeline call. ``eager_reason``: why it runs stock's eager method, if it does."""

    def __init__(self, scheduler, name: str, shared: Shared | None = None):
        self.scheduler, self.name, self.stock = scheduler, name, getattr(type(scheduler), name).__get__(scheduler)
        self.__wrapped__ = self.stock  # its signature is stock's (pipelines ask whether ``step`` takes a generator)
        self.shared = Shared() if shared is None else shared
        self.programs, self.per_step_only, self.created = (
            self.shared.programs,
            self.shared.per_step_only,
            self.shared.created,
        )
        self.eager_reason: str | None = None
        self.compiled_calls = 0
        self._host_tables: dict = {}  # id(host tensor) -> (tensor, version, array): CPU tables moved once

    def __deepcopy__(self, memo):
        """A deep-copied scheduler (LTX-2's audio scheduler, SkyReels-V2's per block) gets its own method, sharing the
        programs. A copied ``__dict__`` put back on the same scheduler (the panorama pipeline's views) keeps this
        one."""
        copy = memo.get(id(self.scheduler))
        return self if copy is None else CompiledSchedulerMethod(copy, self.name, self.shared)

    def __call__(self, *args, **kwargs):
        leaves, spec = pytree.tree_flatten((args, kwargs))
        jax_leaf = next((x for x in leaves if is_jax_tensor(x)), None)
        if self.eager_reason or jax_leaf is None:
            return self.stock(*args, **kwargs)
        scheduler = self.scheduler
        like = to_jax_array(jax_leaf)
        tensors = [x for x in leaves if isinstance(x, torch.Tensor)]
        try:
            state = scheduler_state.state_of(scheduler, INSTALLED)
            state_tensors: list = []
            counter = vars(scheduler).get(COUNTER)
            key = (
                self.name,
                counter is None,  # a schedule's first step finds its counter (stock's lookup): a program of its own
                scheduler_state.flatten(state, state_tensors),
                spec,
                tuple(map(_leaf_key, leaves)),
            )
        except Uncarried as reason:
            self.eager_reason = f"it holds a {reason}, which no program carries"
            logger.info("%s.%s runs eagerly (op by op): %s", type(scheduler).__name__, self.name, self.eager_reason)
            return self.stock(*args, **kwargs)
        found = self.programs.get(key)
        if isinstance(found, str):  # no program runs this state
            return self.stock(*args, **kwargs)
        program = next((p for p in found or () if p.guards.hold(counter)), None)
        arrays = None  # the program's inputs, made here: a view's slice runs within few of the project's frames
        if program is None:
            per_step = (key, counter, digest(tables(state_tensors) + tables(tensors)))
            program = self.programs.get(per_step)
            if program is None:
                arrays = self._arrays(state_tensors + tensors, like)
                call = _Call(state, state_tensors, tensors, args, kwargs, counter, like, arrays)
                program = self._trace(key, per_step, call)
            if isinstance(program, str):
                return self.stock(*args, **kwargs)
        if arrays is None and program.executable is not None and not compile_only.compiling_only():
            arrays = self._arrays(state_tensors + tensors, like)
        return self._run(program, arrays, state_tensors, tensors, leaves, counter, like)

    def _run(self, program, arrays, state_tensors, tensors, leaves, counter, like):
        outputs = []
        if program.executable is not None and compile_only.compiling_only():  # a warm-up: built, nothing runs
            outputs = compile_only.zeros_of(program.out_info)
        elif program.executable is not None:  # (a method that only passes its inputs through runs no program)
            generators = [x for x in leaves if isinstance(x, torch.Generator)]
            draws = [placed(draw_now(d, generators), like) for d in program.draws]
            counter_in = placed(np.int32(counter if type(counter) is int else 0), like)
            outputs = program.executable(arrays[: len(state_tensors)], arrays[len(state_tensors) :], counter_in, draws)
            self.compiled_calls += 1
        for kind, index, output in program.written:  # in place, as stock's op wrote into the caller's tensor
            write_into((state_tensors if kind == "state" else tensors)[index], outputs[output])
        held = vars(self.scheduler)
        for name, template in program.state.items():
            held[name] = scheduler_state.fill(template, outputs, state_tensors, tensors, counter, wrap)
        for name in program.removed:
            held.pop(name, None)
        return scheduler_state.fill(program.result, outputs, state_tensors, tensors, counter, wrap)

    def _arrays(self, tensors: list, like) -> list:
        """Tensors as program inputs: JAX ones as they are, host tables moved once (replicated on ``like``'s mesh)."""
        arrays, kept = [], {}
        for tensor in tensors:
            if is_jax_tensor(tensor):
                arrays.append(to_jax_array(tensor))
                continue
            held = self._host_tables.get(id(tensor))
            if held is None or held[0] is not tensor or held[1] != tensor._version:
                held = (tensor, tensor._version, placed(host_to_jax(tensor), like))
            kept[id(tensor)] = held
            arrays.append(held[2])
        self._host_tables = kept
        return arrays

    def _trace(self, key, per_step_key, call):
        reasons = []
        for mode in (PER_STEP,) if key in self.per_step_only else (GUARDED, PER_STEP):
            try:
                program = self._lower(mode, call)
            except Uncarried as reason:
                reasons.append(f"a {reason}, which no program carries")
                break
            except Exception as error:  # the Python reads a traced value, or the step cannot be traced at all
                reasons.append(f"{type(error).__name__}: {(str(error).splitlines() or [''])[0][:200]}")
                self.per_step_only.add(key)
                continue
            if mode == GUARDED:
                self.programs.setdefault(key, []).append(program)
            else:
                self.programs[per_step_key] = program
            return program
        self.programs[key] = "; ".join(reasons)
        logger.info(
            "%s.%s runs eagerly (op by op) for this state: %s", type(self.scheduler).__name__, self.name, reasons
        )
        return self.programs[key]

    def _lower(self, mode, call: _Call) -> Program:
        scheduler, stock, state, tensors, counter = self.scheduler, self.stock, call.state, call.tensors, call.counter
        # per step, the schedule's tables and the timestep are the program's constants: the Python may read them
        state_constant = [mode == PER_STEP and is_table(t) for t in call.state_tensors]
        arg_constant = [mode == PER_STEP and is_table(t) for t in tensors]
        generators = [x for x in pytree.tree_leaves((call.args, call.kwargs)) if isinstance(x, torch.Generator)]
        arrays = call.arrays
        state_in, args_in = arrays[: len(call.state_tensors)], arrays[len(call.state_tensors) :]
        counter_in = placed(np.int32(0), call.like)
        # the constants read on the host before the trace: inside it, a view's slice (``timesteps[i - 1]``) is staged
        # into the program, and its value cannot be read
        state_hosts = [constant_copy(t) if c else None for t, c in zip(call.state_tensors, state_constant)]
        arg_hosts = [constant_copy(t) if c else None for t, c in zip(tensors, arg_constant)]
        recorded, draws_in = [], []
        while True:  # twice when the first trace finds random draws: they become inputs
            guards, found = Guards(), {}

            def traced(state_arrays, arg_arrays, counter_array, draw_arrays):
                state_wrapped = [wrap(a) if h is None else constant_copy(h) for h, a in zip(state_hosts, state_arrays)]
                args_wrapped = [wrap(a) if h is None else constant_copy(h) for h, a in zip(arg_hosts, arg_arrays)]
                passed = {id(t): (t, "state", i, Template.held(t)) for i, t in enumerate(state_wrapped)}
                passed.update({id(t): (t, "arg", i, Template.held(t)) for i, t in enumerate(args_wrapped)})
                template = Template(passed, to_jax_array)
                fed = iter(args_wrapped)
                call_args, call_kwargs = pytree.tree_map_only(
                    torch.Tensor, lambda _: next(fed), (call.args, call.kwargs)
                )
                before = dict(vars(scheduler))
                vars(scheduler).update(scheduler_state.rebuild(state, iter(state_wrapped)))
                if mode == GUARDED and type(counter) is int:
                    vars(scheduler)[COUNTER] = GuardedIndex.start(counter, lambda: counter_array, guards)
                token = torch_itself.tracing.set(True)
                recorded.clear()
                try:
                    # values known now (the timestep and tables per step, the schedule's glue) stay concrete: the
                    # Python may read them, and the program holds them as constants
                    with jax.ensure_compile_time_eval(), torch.no_grad():
                        with TraceMode(list(draw_arrays), recorded, generators, counter_array):
                            result = stock(*call_args, **call_kwargs)
                    after = dict(vars(scheduler))
                finally:
                    torch_itself.tracing.reset(token)
                    vars(scheduler).clear()
                    vars(scheduler).update(before)
                found["state"] = {
                    name: template.read(value)
                    for name, value in after.items()
                    if name not in before or value is not before[name] or _container(value)
                }
                found["removed"] = tuple(name for name in before if name not in after)
                self.created.update(name for name in after if name not in before)
                found["result"] = template.read(result)
                found["written"] = template.written()
                return template.outputs

            lowered = jax.jit(traced).lower(state_in, args_in, counter_in, draws_in)
            if recorded and not draws_in:
                draws_in = [placed(np.zeros(d.shape, jax_dtype(d.dtype)), call.like) for d in recorded]
                continue
            executable = None
            if jax.tree_util.tree_leaves(lowered.out_info):  # (nothing to run when it only passes inputs through)
                text = (lowered.as_text(), lowered.in_tree)  # (unused inputs are pruned from the text)
                executable = self.shared.executables.get(text) or self.shared.build(lowered)
                self.shared.executables[text] = executable
            return Program(
                guards,
                executable,
                executable.out_info if executable is not None else None,
                found["state"],
                found["removed"],
                found["result"],
                found["written"],
                list(recorded),
            )


class ScheduleReset:
    """``set_timesteps`` as stock's, then the history a last loop left in attributes it does not reset (UniPC's
    ``timestep_list``, ``this_order``) as a fresh scheduler has it: a new schedule's first steps then meet the state
    they met in the first call and run its programs (a pipeline's second call compiles nothing). Stock's results never
    depend on that history (a reused scheduler gives a fresh one's results); only what ``set_timesteps`` left alone and
    a fresh scheduler of the same configuration has, or a compiled step created, is touched."""

    def __init__(self, scheduler, created: set):
        self.scheduler, self.created = scheduler, created
        self.stock = self.__wrapped__ = type(scheduler).set_timesteps.__get__(scheduler)
        self._fresh = None

    def __call__(self, *args, **kwargs):
        scheduler = self.scheduler
        assigned = _assigned_during(scheduler, self.stock, args, kwargs)
        if self._fresh is None:
            self._fresh = vars(type(scheduler).from_config(scheduler.config))
        held = vars(scheduler)
        for name in [n for n in held if n not in assigned and n not in INSTALLED]:
            if name in self._fresh and _history(held[name]):
                held[name] = copy.deepcopy(self._fresh[name])
            elif name in self.created:
                del held[name]
        return assigned.result

    def __deepcopy__(self, memo):
        copied = memo.get(id(self.scheduler))
        return self if copied is None else ScheduleReset(copied, self.created)


def _history(value) -> bool:
    """A container of per-step tensors (UniPC's ``timestep_list``): what a loop leaves behind."""
    return type(value) in (list, tuple, dict) and any(isinstance(x, torch.Tensor) for x in pytree.tree_leaves(value))


class _Assigned(set):
    result = None


_RECORDING: dict = {}  # a scheduler class -> its subclass that records attribute assignments


def _assigned_during(scheduler, method, args, kwargs) -> _Assigned:
    """The attributes ``method`` assigns on ``scheduler`` (its class swapped for the call to one that records them)."""
    cls = type(scheduler)
    if cls not in _RECORDING:

        def __setattr__(self, name, value):
            vars(self).setdefault("_diffusers_tpu_assigned", _Assigned()).add(name)
            super(recording, self).__setattr__(name, value)

        recording = _RECORDING[cls] = type(
            cls.__name__, (cls,), {"__setattr__": __setattr__, "__module__": cls.__module__}
        )
    scheduler.__class__ = _RECORDING[cls]
    try:
        result = method(*args, **kwargs)
    finally:
        scheduler.__class__ = cls
    assigned = vars(scheduler).pop("_diffusers_tpu_assigned", _Assigned())
    assigned.result = result
    return assigned


@dataclasses.dataclass
class _Call:
    state: dict
    state_tensors: list
    tensors: list
    args: tuple
    kwargs: dict
    counter: object
    like: object
    arrays: list


def _container(value) -> bool:
    return type(value) in (list, tuple, dict)


def _leaf_key(leaf):
    if isinstance(leaf, torch.Tensor):
        sharding = to_jax_array(leaf).sharding if is_jax_tensor(leaf) else None
        return ("tensor", tuple(leaf.shape), scheduler_state.program_dtype(leaf.dtype), sharding)
    if isinstance(leaf, torch.Generator):
        return ("generator", leaf.device.type)
    return scheduler_state.flatten(leaf, [])
