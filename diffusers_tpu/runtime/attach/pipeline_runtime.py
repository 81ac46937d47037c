"""``PipelineRuntime``: the one object a moved pipeline holds — its decision, mesh, ledger of overrides, call scope
and compiled components — and where a pipeline call runs (``run_pipeline_call``).

The moves that create and drop it are ``moves`` (``attach``, ``detach``, ``for_call``); how it places components is
``placing`` (its mixin); the ledger of what it changed on the user's objects is ``overrides``.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import time
import weakref
from contextlib import nullcontext

import diffusers
import jax
import torch
from diffusers.callbacks import MultiPipelineCallbacks, PipelineCallback

from ...interop import (
    backend,
    compile_accounting,
    interrupts,
    sharding,
    user_tensors,
)
from ...interop.compat import torchax_mesh
from .. import decision
from ..attention import sdpa
from ..call import cfg, hook_chain, oversized_calls, schedulers
from ..call.call_stats import CallStats
from ..call.denoiser import Denoiser
from ..programs import program_builds, program_store
from . import gpu_script_calls
from .overrides import Overrides
from .placing import Placing

logger = logging.getLogger(__name__)
_ATTR = "_diffusers_tpu_runtime"
_held: weakref.WeakSet = weakref.WeakSet()  # every pipeline holding a runtime (``moves.detach_all``)


def runtime_of(pipe) -> PipelineRuntime | None:
    return vars(pipe).get(_ATTR)


def hold(pipe, runtime: PipelineRuntime) -> None:
    """``pipe`` runs on ``runtime`` from now on (``moves.attach``)."""
    vars(pipe)[_ATTR] = runtime
    _held.add(pipe)


def release(pipe) -> PipelineRuntime | None:
    """``pipe`` no longer holds its runtime (``moves.detach``): the one it held, if any."""
    _held.discard(pipe)
    return vars(pipe).pop(_ATTR, None)


def attached_pipelines() -> list:
    """Every live pipeline that holds a runtime."""
    return [pipe for pipe in list(_held) if runtime_of(pipe) is not None]


def is_attached(pipe) -> bool:
    return runtime_of(pipe) is not None


class PipelineRuntime(Placing):
    """A moved pipeline's runtime: carries out a ``decision.Decision`` (what was decided for ``pipe.to``) and holds
    the call context and what it changed."""

    def __init__(self, pipe, decided: decision.Decision, user_dtype):
        self.pipe, self.decision = pipe, decided
        self.family, self.config, self.target = decided.family, decided.config, decided.target
        family, config, target = self.family, self.config, self.target
        self.mesh = mesh = backend.build_mesh(decided.mesh_shape, list(decided.devices))
        # Eager ops' arrays: on this process's first mesh device (a multi-host run cannot hold another host's).
        self.home_device = next(d for d in mesh.devices.flat if d.process_index == jax.process_index())
        # The VAE runs on its own mesh over the same devices: a redundant batch axis x a spatial axis.
        self.vae_mesh = backend.build_mesh(decided.vae_mesh_shape, list(mesh.devices.flat))
        self.user_dtype = user_dtype
        self.moved_with = (target.requested, config, user_dtype)  # how to move it again (``shared_components``)
        self.attention = sdpa.AttentionSettings(
            mesh,
            config.attention_for(target.platform),
            config.attention_kv_threshold,
            config.attention_block_sizes,
            config.attention_k_smoothing,
        )
        batch_cfg = config.batch_cfg == "auto" and mesh.shape["dp"] >= 2 or config.batch_cfg is True
        self.pairing = None
        if batch_cfg and family.cfg is not None:
            self.pairing = cfg.CFGPairing(family.cfg, guided=self._guider_runs_the_pair)
        self.last_call = CallStats()
        self.attached = True
        self.denoisers: dict[str, Denoiser] = {}
        self.chains: dict[tuple, hook_chain.HookChain] = {}  # (id(owner), method) -> the hooks around it
        self._compiled: dict = {}  # (id(module), method name) -> its CompiledFunction (``compiled_of``)
        self.overrides = Overrides(lambda: self.attached)  # undone by ``undo`` (``pipe.to("cpu")``)
        self.recorded = None  # the denoiser's last output (``hook_chain.Recording``)
        # user code ran since (a call began, a callback returned): the denoiser checks what it may have changed
        self.user_code_runs = 0
        self.scheduler_programs: dict = {}  # id(scheduler) -> (scheduler, its compiled methods): kept between calls
        self.compile_log: compile_accounting.CompileLog | None = None  # the running call's
        self.placing_programs = 0  # programs ``place`` built (``CallStats.placing_programs``)
        self._depth = 0  # > 0 inside a pipeline call or a public entry point: JAX tensors flow freely
        # > 0 inside a method run on the host (``stock_on_host.OnHost``): text encoders' outputs stay there
        self.encoding_on_host = 0
        self.text_encoder_placement = decided.text_encoders  # "host" or "jax"
        # weights the modules show as ``meta`` between calls (``sequential_offload``); None: modules hold their own
        self.hidden_weights = None
        # programs built ahead (``TPUConfig.programs``): loaded instead of compiled, what compiles written there
        self.store = program_store.ProgramStore(config.programs) if config.programs is not None else None
        # how every program but the VAE's is built (full effort; through the store when there is one)
        self.program_build = program_builds.builder("full", target.platform, store=self.store)

    # -- context every JAX call runs in --------------------------------------------------------------------
    @contextlib.contextmanager
    def jax_context(self, settings: sdpa.AttentionSettings | None = None, mesh=None):
        """The context JAX calls run in; ``settings``: the attention of the module being called (default: safe);
        ``mesh``: the one its programs run on (default: the pipeline's; convolutions are guarded against it,
        ``torchax_mesh.mesh_of_traces``). The matmul precision is part of every program's trace (TPU and GPU would
        otherwise run float32 products in bfloat16 / TF32 and leave stock's results)."""
        with (
            backend.jax_mode(),
            sdpa.use(settings or sdpa.SAFE),
            gpu_script_calls.attention_dispatch_on_jax(),
            jax.default_device(self.home_device),
            jax.default_matmul_precision(self.config.matmul_precision),
            torchax_mesh.mesh_of_traces(mesh or self.mesh),
        ):
            yield

    def weights_shown(self):
        """Inside a call the modules hold their weights (``sequential_offload`` shows ``meta`` ones between calls)."""
        return self.hidden_weights.shown() if self.hidden_weights is not None else contextlib.nullcontext()

    @contextlib.contextmanager
    def call_scope(self):
        """Like a pipeline call (JAX tensors flow between entry points), for a pipeline's own generator methods."""
        self.user_code_runs += 1  # entered from user code, which may have changed a model since
        outermost = self._depth == 0  # (a generator method's loop steps the schedulers as a call's does)
        self._depth += 1
        try:
            with self.jax_context(), self.weights_shown(), self._schedulers_on_device() if outermost else nullcontext():
                yield
        finally:
            self._depth -= 1

    @contextlib.contextmanager
    def user_code_scope(self):
        """User code running inside a call (a step callback): plain torch, and entry points convert as from outside."""
        depth, self._depth = self._depth, 0
        try:
            with backend.torch_mode():
                yield
        finally:
            self._depth = depth
            self.user_code_runs += 1

    def _guider_runs_the_pair(self) -> bool:
        """A diffusers guider (``pipe.guider``) set to the step about to run has an unconditional pass at it
        (``num_conditions``: a guider enabled for part of the schedule has one); without a guider, the loop decides."""
        guider = getattr(self.pipe, "guider", None)
        return guider is None or getattr(guider, "num_conditions", 2) > 1

    def inside_call(self) -> bool:
        """Inside a pipeline call or a public entry point: JAX tensors flow between methods."""
        return self._depth > 0

    def run_pipeline_call(self, stock_call, pipe, args, kwargs):
        if self._depth:  # a subclass __call__ wrapping the stock one
            return stock_call(pipe, *args, **kwargs)
        bound = inspect.signature(stock_call).bind(pipe, *args, **kwargs)
        checked = inspect.signature(stock_call).bind(pipe, *args, **kwargs)
        checked.apply_defaults()
        # before anything is allocated
        oversized_calls.check_fits(pipe, checked.arguments, list(self.mesh.devices.flat))
        if self.family.check_call is not None:  # bad input fails here, before anything compiles
            self.family.check_call(pipe, checked.arguments)
        self._host_callback(bound)
        self._depth, self.last_call = 1, CallStats()
        self.user_code_runs += 1
        if self.pairing:
            self.pairing.reset()
        start = time.perf_counter()
        try:
            with interrupts.watch(), self.jax_context(), self.weights_shown(), compile_accounting.compile_log() as log:
                with self._schedulers_on_device():
                    self.compile_log = log
                    out = user_tensors.to_host(stock_call(*bound.args, **bound.kwargs))
        finally:
            self._depth, self.recorded, self.compile_log = 0, None, None
        self.last_call.total_seconds = time.perf_counter() - start
        self.last_call.compile_seconds, self.last_call.compilations = log.seconds, log.compilations
        self.last_call.cache_hits = log.cache_hits
        self.last_call.placing_programs = self.placing_programs
        self.last_call.process_programs = compile_accounting.process_programs().compilations
        logger.info("%s on %s: %s", type(pipe).__name__, self.target.platform, self.last_call.summary())
        return out

    def _host_callback(self, bound) -> None:
        """A step callback sees host tensors (``user_tensors.host_callback``); a PipelineCallback keeps its tensor
        list."""
        callback = bound.arguments.get("callback_on_step_end")
        if callback is None:
            return

        if isinstance(callback, (PipelineCallback, MultiPipelineCallbacks)):
            bound.arguments["callback_on_step_end_tensor_inputs"] = callback.tensor_inputs
        bound.arguments["callback_on_step_end"] = user_tensors.host_callback(callback, self.user_code_scope)

    def replaced_components(self) -> list[str]:
        """Components the user set anew since the move (``pipe.unet = UNet2DConditionModel(...)``): placed modules
        no longer at their place."""
        now = {name: getattr(self.pipe, name, None) for name in self.decision.plans}
        return [
            name
            for name, (module, _, _) in self.decision.plans.items()
            if now[name] is not module and getattr(now[name], "_orig_mod", None) is not module  # torch.compile'd
        ]

    def catch_up(self) -> None:
        """Before a call (``entry_points.catch_up``): a ``torch.compile``'d component runs its original module, and
        weights an offload hook no longer manages come back to the devices."""
        self._unwrap_compiled_components()
        self._weights_in_place()

    def _weights_in_place(self) -> None:
        """Components whose weights went to the host with an offload hook that is gone (``pipe.remove_all_hooks()``)
        come back to the devices; those a hook still manages move when they run (``model_offload``)."""
        for name, (module, _, _) in self.decision.plans.items():
            if not getattr(getattr(module, "_hf_hook", None), "places_on_use", False):
                self.put_on_devices(name)

    def _unwrap_compiled_components(self) -> None:
        """``pipe.transformer = torch.compile(pipe.transformer)`` after the move: XLA compiles it already."""
        for name, module in list(self.pipe.components.items()):
            original = getattr(module, "_orig_mod", None)
            if isinstance(module, torch.nn.Module) and sharding.is_placed(original or module) and original is not None:
                gpu_script_calls.warn_once(
                    f"torch.compile-{name}",
                    f"pipe.{name} was torch.compile'd on JAX: XLA compiles it already, so the original module runs.",
                )
                setattr(self.pipe, name, original)

    @contextlib.contextmanager
    def _schedulers_on_device(self):
        """During a call, scheduler tables that device timesteps index live on JAX (``schedulers``); outside one the
        scheduler is a plain host object (a user's own loop, a scheduler swapped after the move)."""
        undo = []
        for scheduler in (c for c in self.pipe.components.values() if isinstance(c, diffusers.SchedulerMixin)):
            undo.extend(schedulers.place(scheduler))
            if self.config.compile_scheduler:
                undo.extend(schedulers.compile_steps(scheduler, self.scheduler_programs, self.program_build))
            if self.config.scheduler_dtype is not None:
                undo.extend(schedulers.keep_dtype(scheduler, self.config.scheduler_dtype))
        try:
            yield
        finally:
            for step in reversed(undo):
                step()
            for scheduler in (c for c in self.pipe.components.values() if isinstance(c, diffusers.SchedulerMixin)):
                schedulers.to_host(scheduler)

    def undo(self) -> None:
        self.attached = False
        self.overrides.undo_all()
