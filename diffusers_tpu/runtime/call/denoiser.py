"""The compiled entry of a denoising transformer: one program per call, or compiled units under diffusers hooks.

Without hooks, a call runs ONE compiled program (the whole forward), its repeated blocks traced as one loop
(``repeated_blocks``: compiled once, not once per layer). The program's inputs are the weights, the
tensor arguments and the LoRA scales (``lora.Scalings``); its key includes which adapters exist and are active.
Before each call the entry brings the placement up to date (adapters loaded or deleted after the move).

Step caches (``enable_cache``) run in whole-step programs (``step_caches``); other hooks in **units**: stock forward
and hooks eagerly on the host, each submodule below the hooks its own program — the slow route, said once. Placement
hooks (layerwise casting, group offloading, context parallelism) have TPU equivalents: refused with a clear error.

Hooks registered before ``pipe.to("tpu")`` wrap the stock ``forward`` of their module; the unit program is spliced
into the innermost position of that chain (``HookRegistry._fn_refs``, diffusers 0.42), so the hooks run around it.

Code a trace cannot take (data-dependent shapes: ``torch.nonzero``, boolean indexing, ``.item()`` deciding control
flow) takes the same route: a module whose forward fails to trace runs eagerly from then on, its submodules as
compiled units — slower, never different. One warning names the module; a family file can then replace the code
with a jit-safe equivalent (as ``hunyuan_video15.py`` does).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import logging

import jax
import torch

from ...interop import backend, sharding
from ...interop.jit import CompiledFunction, place_arguments
from ...interop.torch_private import pytree
from .. import diffusers_private
from ..weights import lora, quantize, stacked_weights
from . import repeated_blocks, step_caches
from .denoiser_hooks import HookRoute, active_hooks, batches_pair, check_hooks, inner_hooks

logger = logging.getLogger(__name__)

_units_on: contextvars.ContextVar[bool] = contextvars.ContextVar("diffusers_tpu_units", default=False)
# what a trace raises on data-dependent Python control flow or shapes (the module then runs eagerly)
TRACE_ERRORS = (
    jax.errors.ConcretizationTypeError,
    jax.errors.TracerBoolConversionError,
    jax.errors.TracerIntegerConversionError,
    jax.errors.TracerArrayConversionError,
    jax.errors.NonConcreteBooleanIndexError,
)


def forget_unfinished(compiled) -> None:
    """Drop the programs of ``compiled`` whose trace failed half-way."""
    for key in [k for k, program in compiled.programs.items() if program.out_spec is None]:
        del compiled.programs[key]


def runs_in_units(module: torch.nn.Module) -> bool:
    """Whether ``module``'s diffusers hooks keep each guidance pass its own call: the unit route, or a step cache whose
    state the two passes share (``step_caches``: Pyramid Attention Broadcast); the others batch the pair."""
    hooks = active_hooks(module)
    inner = inner_hooks(hooks, module)
    return bool(hooks) and not batches_pair(step_caches.recognize(module, inner) if inner else None, hooks, module)


def innermost_forward(module):
    """The forward a hook chain on ``module`` ends in (``module.forward`` without hooks)."""
    found = diffusers_private.innermost_forward_reference(module)
    return module.forward if found is None else getattr(*found)


class Denoiser:
    """The callable installed as a placed denoiser's ``forward`` (see the module docstring)."""

    def __init__(self, runtime, module: torch.nn.Module, forward, rules, settings, place_input, state=None):
        self.runtime, self.module, self.forward, self.rules = runtime, module, forward, rules
        self.__wrapped__ = forward  # its signature is the forward's (stock code inspects it)
        self.settings, self.place_input = settings, place_input
        self.scalings = lora.Scalings(module)
        scan = repeated_blocks.scanning if runtime.config.scan_blocks else None
        self.whole = CompiledFunction(
            module,
            forward,
            state=state or self._state(""),
            jax_context=self._jax_context,
            place_input=place_input,
            extras=self.scalings,
            trace_hook=scan,
            build=runtime.program_build,
        )
        # the whole-forward program's handles, as on any compiled function (memory analysis, lowering, tests)
        self.programs, self.jax_context, self.state = self.whole.programs, self.whole.jax_context, self.whole.state
        self._lora_key = lora.structure_key(module)
        self._synced_at = -1  # the runtime's ``user_code_runs`` at the last sync
        self._units: dict[int, object] = {}  # id(submodule) -> compiled unit
        self._plans: dict = {}
        self._active_units: set[int] = set()  # units of the current plan
        self._hooks: dict = {}
        self.eager: set[int] = set()  # modules whose forward a trace cannot take: run eagerly, children as units
        self.unit_calls = 0  # compiled unit programs run (hooked calls): a skipped block is not counted
        self.hooked_calls = 0  # of those, units that carry hooks (the blocks a step cache may skip)
        self._caches: dict = {}  # the hooks' identities -> the step cache recognized (None: the unit route)
        self._partnered = None  # the step cache of the batched pair whose "uncond" call is still to come
        self._cached: dict[int, CompiledFunction] = {}  # id(step cache) -> its whole-step programs
        self.passes = step_caches.PassLog()  # hooked calls' passes: blocks computed, programs run

    def _jax_context(self):
        return self.runtime.jax_context(self.settings)

    def _state(self, prefix: str):
        cache: dict = {}

        def state() -> dict:
            slots = sharding.slots_of(self.module)
            if cache.get("slots") is not slots:  # resync makes a new list
                cache["slots"] = slots
                cache["mine"] = [s for s in slots if s.qualified.startswith(prefix)]
            if not prefix:  # the whole forward: stacked weights as one argument each
                return stacked_weights.program_state(cache["mine"], quantize.program_value)
            return {
                s.qualified[len(prefix) :]: quantize.program_value(s, sharding.tensor_of(s).jax())
                for s in cache["mine"]
            }

        return state

    def sync(self) -> None:
        """Unmerge disabled merged adapters (stock does it inside forward) and place adapters added since: once
        after user code ran (``PipelineRuntime.user_code_runs``), not at every step (each check walks the model)."""
        if self._synced_at == self.runtime.user_code_runs:
            return
        self._synced_at = self.runtime.user_code_runs
        lora.prepare(self.module)
        key = lora.structure_key(self.module)
        if key != self._lora_key or sharding.needs_resync(self.module):
            sharding.resync(self.module, self.runtime.mesh, self.rules)
            self._lora_key = key

    def hook_route(self) -> HookRoute:
        """How the hooks on the denoiser run (``HookRoute``)."""
        hooks = active_hooks(self.module)
        if not hooks:
            return HookRoute.NONE
        if self.eager:  # the unit route (``__call__``): stock's hooks see one context per call
            return HookRoute.UNITS
        inner = inner_hooks(hooks, self.module)
        cache = self.step_cache(inner) if inner else None
        if not batches_pair(cache, hooks, self.module):
            return HookRoute.UNITS
        return HookRoute.PROGRAM if cache.state_per_context else HookRoute.INPUTS

    def pair_answered(self) -> None:
        """The loop's "uncond" call got its half of a batched pair: the step cache that planned both is told."""
        cache, self._partnered = self._partnered, None
        try:
            if cache is not None:
                cache.partner_called()
        except RuntimeError:  # the call stops: stock's hook state reset as its pipelines do at a call's end
            diffusers_private.reset_cache_hooks(self.module)
            raise

    def step_cache(self, hooks: dict):
        """The step cache run in whole-step programs for ``hooks`` (the denoiser's inner ones), or None."""
        registries = {id(m): diffusers_private.hook_registry(m).hooks for m in hooks}
        key = tuple((id(m), *(id(registries[id(m)][n]) for n in names)) for m, names in hooks.items())
        if key not in self._caches:
            found = step_caches.recognize(self.module, hooks) if self.runtime.config.scan_blocks else None
            self._caches = {key: found}  # the latest hooks only: a disabled cache's objects are let go
            if found is None:
                logger.warning(
                    "%s: diffusers hooks %s run in units — the stock hooks eagerly on the host, each block its own "
                    "program, the guidance pair as two calls: the same result, the slow route.",
                    type(self.module).__name__,
                    sorted({n.split("---")[0] for names in hooks.values() for n in names}),
                )
        return self._caches[key]

    def __call__(self, *args, **kwargs):
        if not self.runtime.attached:
            return self.forward(*args, **kwargs)
        self.sync()
        self._partnered = None  # a call that reached the entry: no batched pair's partner pending
        check_hooks(self.module, f"{type(self.module).__name__} call")
        # hooks on the denoiser itself run around this entry; only hooks inside it need units
        hooks = inner_hooks(active_hooks(self.module), self.module)
        with lora.scale_from_kwargs(self.module, kwargs) as kwargs:
            if not hooks and id(self.module) not in self.eager:
                try:
                    return self.whole(*args, **kwargs)
                except TRACE_ERRORS as error:
                    self._cannot_trace(self.module, self.whole, error)
            cache = self.step_cache(hooks) if hooks and not self.eager else None
            if cache is not None:
                try:
                    return self._run_cached(cache, args, kwargs)
                except step_caches.NotInProgram as why:
                    cache.hand_back()
                    self._caches = {key: None for key in self._caches}
                    logger.warning("%s: %s; its hooks run in units (the slow route).", type(self.module).__name__, why)
                    if step_caches.batched_contexts():  # the units' stock hooks see one context for both halves
                        raise RuntimeError(
                            f"{type(self.module).__name__}: {why}, in a call that batched the guidance pair; the "
                            "cache now runs in units with the pair as two calls. Call the pipeline again."
                        ) from why
            return self._run_units(hooks, args, kwargs)

    def cached_program(self, cache) -> CompiledFunction:
        """The whole-step programs of ``cache`` (one per key: which contexts, their decisions or kept state)."""
        if id(cache) not in self._cached:
            cache.spread = functools.partial(_spread_kept_state, self.runtime.mesh)
            self._cached = {  # the latest cache only
                id(cache): CompiledFunction(
                    self.module,
                    cache.step(self.forward),
                    state=self.whole.state,
                    jax_context=self._jax_context,
                    place_input=self.place_input,
                    extras=step_caches.Extras(self.scalings, cache),
                    trace_hook=cache.trace_hook(repeated_blocks.scanning),
                    build=self.runtime.program_build,
                )
            }
        return self._cached[id(cache)]

    def _run_cached(self, cache, args, kwargs):
        """A call under a step cache the runtime runs in whole-step programs (``step_caches``)."""
        compiled = self.cached_program(cache)
        cache.called_with(args, kwargs)
        cache.plan(step_caches.batched_contexts() or (cache.current_context(),))
        try:
            out, state = compiled(*args, **kwargs)
        except BaseException:
            cache.undo_plan()
            forget_unfinished(compiled)
            raise
        self.passes.record(cache.commit(state), programs=1)
        self._partnered = cache if len(cache.contexts) > 1 else None  # until the partner's call (``pair_answered``)
        return out

    def _cannot_trace(self, module, compiled, error) -> None:
        """``module``'s forward failed to trace: forget the half-built program, run it eagerly from now on."""
        forget_unfinished(compiled)
        self.eager.add(id(module))
        self._plans.clear()
        names = {id(m): n for n, m in self.module.named_modules()}
        logger.warning(
            "%s.%s cannot be traced by JAX (%s: %s); it now runs eagerly with its submodules compiled "
            "one by one: the same results, slower. A family file can make it jit-safe.",
            type(self.module).__name__,
            names.get(id(module)) or "forward",
            type(error).__name__,
            str(error).splitlines()[0][:200],
        )

    # -- units under hooks ---------------------------------------------------------------------------------
    def _run_units(self, hooks: dict, args, kwargs):
        self._hooks = hooks
        self._install_units(hooks)

        leaves, spec = pytree.tree_flatten((args, kwargs))
        tensors = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]
        placed = place_arguments(self.place_input, [backend.to_jax_array(leaves[i]) for i in tensors])
        for i, array in zip(tensors, placed):
            leaves[i] = backend.wrap(array)
        args, kwargs = pytree.tree_unflatten(leaves, spec)
        token, before, units = _units_on.set(True), self.hooked_calls, self.unit_calls
        try:
            with self._jax_context():
                return self.forward(*args, **kwargs)
        finally:
            _units_on.reset(token)
            count = self.hooked_calls - before
            self.passes.record([(True, count, count)], programs=self.unit_calls - units)

    def _install_units(self, hooks: dict) -> None:
        signature = (
            tuple(sorted((id(m), id(diffusers_private.innermost_forward_reference(m)[0])) for m in hooks)),
            frozenset(self.eager),
        )
        if signature in self._plans:
            self._active_units = self._plans[signature]
            return
        names = {id(m): name for name, m in self.module.named_modules()}
        hooked = {names[id(m)] for m in hooks}
        eager = {names[i] for i in self.eager if i in names} | hooked  # their own forward runs eagerly

        def holds_eager(name):  # eager itself or above an eager module
            return any(e == name or e.startswith(f"{name}.") for e in eager)

        def eager_below(name):
            return any(e.startswith(f"{name}.") for e in eager)

        units: set[int] = set()

        def visit(parent, prefix):
            for child_name, child in parent.named_children():
                name = f"{prefix}{child_name}"
                if isinstance(child, (torch.nn.ModuleList, torch.nn.ModuleDict)):
                    visit(child, f"{name}.")
                elif not holds_eager(name):
                    units.add(self._unit(child, name, hooked=False))
                elif name in hooked and not eager_below(name) and id(child) not in self.eager:
                    units.add(self._unit(child, name, hooked=True))
                else:
                    visit(child, f"{name}.")

        visit(self.module, "")
        self._active_units = self._plans[signature] = units

    def _unit(self, module, name: str, hooked: bool) -> int:
        """Make ``module`` run as its own compiled program in unit mode (its stock forward otherwise)."""
        if hooked:
            reference, attribute = diffusers_private.innermost_forward_reference(module)
            stock = getattr(reference, attribute)
        else:
            stock = module.forward
        if getattr(stock, "_diffusers_tpu_unit", False):
            return id(module)  # installed before (a hook registered on top of it keeps it innermost)
        compiled = CompiledFunction(
            module,
            stock,
            state=self._state(f"{name}."),
            jax_context=self._jax_context,
            extras=lora.Scalings(module),
            build=self.runtime.program_build,
        )
        entry, key = self, id(module)

        def unit(*args, **kwargs):
            if not _units_on.get() or key not in entry._active_units or not entry.runtime.attached:
                return stock(*args, **kwargs)
            entry.unit_calls += 1
            entry.hooked_calls += hooked
            try:
                with units_off():  # what it calls (and traces) is plain stock code
                    return compiled(*args, **kwargs)
            except TRACE_ERRORS as error:
                entry._cannot_trace(module, compiled, error)
                entry._install_units(entry._hooks)  # its submodules become units, from this call on
                return stock(*args, **kwargs)

        unit._diffusers_tpu_unit = True
        unit.__wrapped__ = stock
        if hooked:
            setattr(reference, attribute, unit)
            self.runtime.overrides.add_undo(
                lambda: setattr(reference, attribute, stock) if getattr(reference, attribute) is unit else None,
                f"{type(reference).__name__}.{attribute}",
            )
        else:
            self.runtime.overrides.set(module, "forward", unit)
        return key


def _spread_kept_state(mesh, tensor):
    """A step cache's kept state ([rows, tokens, features], or stacked over the layers) over every device: tokens over
    dp·sp, features over tp (left free: replicated over dp and tp, +6 GB a device at Wan2.1-14B 720p, BENCHMARKS)."""
    spec = (None,) * (tensor.ndim - 2) + (("dp", "sp"), "tp")
    return sharding.constrain(tensor, mesh, spec) if tensor.ndim in (3, 4) else tensor


@contextlib.contextmanager
def units_off():
    """Run submodules with their stock forward even inside a unit-mode call (e.g. a nested trace)."""
    token = _units_on.set(False)
    try:
        yield
    finally:
        _units_on.reset(token)
