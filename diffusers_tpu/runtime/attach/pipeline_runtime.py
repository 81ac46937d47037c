"""Attach a stock diffusers pipeline to JAX (place, shard, compile) and detach it again.

``pipe.to("tpu")`` lands in ``attach``: it validates everything (platform, family, mesh, sharding plans)
before a single weight moves, then places each component, installs per-instance overrides and records them,
so ``pipe.to("cpu")`` (``detach``) restores the plain torch pipeline exactly.

Over 400 lines on purpose: ``PipelineRuntime`` is the one object a moved pipeline holds (its call context and
placement); the ledger of what it changed is ``overrides``, the checks before a move are ``placement`` and
``registry``.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import time
import types

import diffusers
import jax
import torch
from diffusers.callbacks import MultiPipelineCallbacks, PipelineCallback
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from ...interop import (
    backend,
    compat_mesh,
    compile_accounting,
    interrupts,
    jit,
    processes,
    sharding,
    user_tensors,
    vae_mesh,
)
from ...interop.host_stored import program_array
from ...interop.weights import Gathered
from .. import decision, diffusers_private, support
from ..attention import sdpa
from ..call import cfg, forward_chain, oversized_calls, postprocess, schedulers, stock_on_host
from ..call.call_stats import CallStats, timed_progress_bar
from ..call.denoiser import TRACE_ERRORS, Denoiser, forget_unfinished, innermost_forward
from ..config import TPUConfig
from ..gpu_script import gpu_script_calls
from ..programs import program_builds, program_store
from ..registry import family_of, vae_methods
from ..weights import host_memory, quantize, stacked_weights
from . import placement, shared_components
from .overrides import Overrides

logger = logging.getLogger(__name__)
_ATTR = "_diffusers_tpu_runtime"


def runtime_of(pipe) -> PipelineRuntime | None:
    return vars(pipe).get(_ATTR)


def is_attached(pipe) -> bool:
    return runtime_of(pipe) is not None


class PipelineRuntime:
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
            self.pairing = cfg.CFGPairing(family.cfg)
        self.last_call = CallStats()
        self.attached = True
        self.denoisers: dict[str, Denoiser] = {}
        self.chains: dict[str, forward_chain.ForwardChain] = {}  # the layers around each denoiser's forward
        self._compiled: dict = {}  # (id(module), method name) -> its CompiledFunction (``compiled_of``)
        self.overrides = Overrides(lambda: self.attached)  # undone by ``undo`` (``pipe.to("cpu")``)
        self._last_output = None
        self._log: compile_accounting.CompileLog | None = None
        self.placing_programs = 0  # programs ``place`` built (``CallStats.placing_programs``)
        self._depth = 0  # > 0 inside a pipeline call or a public entry point: JAX tensors flow freely
        # > 0 inside a method run on the host (``stock_on_host.run_on_host``): text encoders' outputs stay there
        self._encoding_on_host = 0
        self.text_encoder_placement = decided.text_encoders  # "host" or "jax"
        # weights the modules show as ``meta`` between calls (``sequential_offload``); None: modules hold their own
        self.hidden_weights = None
        # programs built ahead (``TPUConfig.programs``): loaded instead of compiled, what compiles written there
        self.store = program_store.ProgramStore(config.programs) if config.programs is not None else None
        # how every program but the VAE's is built (full effort; through the store when there is one)
        self.program_build = program_builds.builder("full", target.platform, store=self.store)

    # -- context every JAX call runs in --------------------------------------------------------------------
    @contextlib.contextmanager
    def active(self, settings: sdpa.AttentionSettings | None = None, mesh=None):
        """The context JAX calls run in; ``settings``: the attention of the module being called (default: safe);
        ``mesh``: the one its programs run on (default: the pipeline's; convolutions are guarded against it,
        ``compat_mesh.mesh_of_traces``). The matmul precision is part of every program's trace (TPU and GPU would
        otherwise run float32 products in bfloat16 / TF32 and leave stock's results)."""
        with (
            backend.jax_mode(),
            sdpa.use(settings or sdpa.SAFE),
            gpu_script_calls.native_attention_dispatch(),
            jax.default_device(self.home_device),
            jax.default_matmul_precision(self.config.matmul_precision),
            compat_mesh.mesh_of_traces(mesh or self.mesh),
        ):
            yield

    def weights_shown(self):
        """Inside a call the modules hold their weights (``sequential_offload`` shows ``meta`` ones between calls)."""
        return self.hidden_weights.shown() if self.hidden_weights is not None else contextlib.nullcontext()

    @contextlib.contextmanager
    def call_scope(self):
        """Like a pipeline call (JAX tensors flow between entry points), for a pipeline's own generator methods."""
        self._depth += 1
        try:
            with self.active(), self.weights_shown():
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

    def user_entry(self, method):
        """An entry point users call: outside a pipeline call its tensor inputs may be CPU tensors and its outputs
        are CPU tensors (``user_tensors``); inside one it passes JAX tensors through."""

        @functools.wraps(method)
        def entry(*args, **kwargs):
            if self._depth:
                return method(*args, **kwargs)
            self._depth += 1
            try:
                with self.active(), self.weights_shown():
                    return user_tensors.to_host(method(*user_tensors.to_device(args), **user_tensors.to_device(kwargs)))
            finally:
                self._depth -= 1

        return entry

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
        self._unwrap_compiled_components()
        self._weights_in_place()
        self._depth, self.last_call = 1, CallStats()
        if self.pairing:
            self.pairing.reset()
        start = time.perf_counter()
        try:
            with interrupts.watch(), self.active(), self.weights_shown(), compile_accounting.compile_log() as log:
                with self._schedulers_on_device():
                    self._log = log
                    out = user_tensors.to_host(stock_call(*bound.args, **bound.kwargs))
        finally:
            self._depth, self._last_output, self._log = 0, None, None
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
            if self.config.scheduler_dtype is not None:
                undo.extend(schedulers.keep_dtype(scheduler, self.config.scheduler_dtype))
        try:
            yield
        finally:
            for step in reversed(undo):
                step()
            for scheduler in (c for c in self.pipe.components.values() if isinstance(c, diffusers.SchedulerMixin)):
                schedulers.to_host(scheduler)

    # -- placement -------------------------------------------------------------------------------------------
    def _batch_input(self, array):
        """A denoiser argument: split over ``dp`` when it is batch-major (its leading dimension the call's batch,
        ``jit.call_batch``) and ``dp`` divides it, else whole. (Sequence-major tables given as arguments, CogVideoX's
        rotary tables, were split along the sequence and gathered again in every block.)"""
        batch = jit.call_batch()
        if len(array.shape) and array.shape[0] % self.mesh.shape["dp"] == 0 and batch in (None, array.shape[0]):
            return processes.place(array, NamedSharding(self.mesh, P("dp")))
        return processes.place(array, NamedSharding(self.mesh, P()))

    def place_vae_input(self, array):
        """VAE inputs on the VAE's own mesh: width over every device when it divides, else height, else whole."""
        mesh = self.vae_mesh
        return processes.place(array, NamedSharding(mesh, P(*vae_mesh.spatial_spec(array.shape, mesh.size))))

    def _recording_output(self, forward):
        def recorded(*args, **kwargs):
            interrupts.raise_if_dropped()  # a Ctrl-C Python dropped stops the call here, within a step
            out = forward(*args, **kwargs)
            self._last_output = out
            return out

        recorded.__wrapped__ = forward
        return recorded

    def place(self, plans: dict) -> None:
        pipe, family = self.pipe, self.family
        for name, (module, slots, rules) in plans.items():
            self.put_on_devices(name)
            self.overrides.add_undo(functools.partial(sharding.restore, module))
            self.overrides.add_undo(shared_components.claim(self, module))
            self.overrides.set(module, "state_dict", stock_on_host.host_state_dict(module.state_dict, module))
            for part in module.modules():  # models inside it save themselves too (``MultiAdapter``'s adapters)
                if part is not module and callable(getattr(part, "save_pretrained", None)):
                    self.overrides.set(part, "state_dict", stock_on_host.host_state_dict(part.state_dict, part))
            gpu_script_calls.install_module_overrides(self, module)
            state = functools.partial(_state, slots)
            if name in family.denoisers:
                self._place_denoiser(name, module, rules)
            elif name == "vae" and family.vae_install is not None:
                family.vae_install(module, self, state, self.place_vae_input)
            elif name == "vae" or _autoencoder_parts(module):  # a second autoencoder too (LTX-2's audio VAE)
                methods, place_input = (
                    (family.vae_methods, self.place_vae_input)
                    if name == "vae"
                    else (_autoencoder_parts(module), lambda array: array)
                )
                for spec in methods:
                    path, _, method = spec.rpartition(".")
                    owner = module.get_submodule(path) if path else module
                    prefix = f"{path}." if path else ""
                    owned = functools.partial(_state, [s for s in slots if s.qualified.startswith(prefix)], prefix)
                    if name == "vae":
                        self.overrides.set(owner, method, self.compiled_vae_method(owner, method, owned))
                    else:
                        self._jit(owner, method, owned, place_input)
                self.enter_public_vae_methods(module)
            else:
                self._jit(module, "forward", state)
                self.overrides.set(module, "forward", self.user_entry(module.forward))
        host_encoders = placement.text_encoder_names(pipe) if self.text_encoder_placement == "host" else []
        for name in host_encoders:
            module = getattr(pipe, name)
            self.overrides.add_undo(shared_components.claim(self, module))
            self.overrides.set(module, "forward", stock_on_host.on_host(module.forward, self))
            if self.user_dtype is not None:
                module.to(self.user_dtype)
        if host_encoders and "device" in stock_on_host.parameters(getattr(pipe, "encode_prompt", None)):
            self.overrides.set(pipe, "encode_prompt", stock_on_host.run_on_host(pipe.encode_prompt, self))
        for name in stock_on_host.HOST_HELPERS:
            if "device" in stock_on_host.parameters(getattr(pipe, name, None)):
                self.overrides.set(pipe, name, stock_on_host.run_on_host(getattr(pipe, name), self))
        if self.pairing is not None:
            self.overrides.set(pipe, "encode_prompt", self.pairing.capture_negative(pipe.encode_prompt))
        if callable(getattr(pipe, "encode_prompt", None)):  # users call it too, e.g. to precompute embeddings
            self.overrides.set(pipe, "encode_prompt", self.user_entry(pipe.encode_prompt))
        self.overrides.set(pipe, "progress_bar", timed_progress_bar(self, pipe.progress_bar))
        processor = getattr(pipe, "video_processor", None)
        if self.config.postprocess_on_device and processor is not None:
            postprocess.install(processor)
            self.overrides.add_undo(functools.partial(postprocess.uninstall, processor))
        image_processor = getattr(pipe, "image_processor", None)
        if (
            self.config.postprocess_on_device
            and image_processor is not None
            and postprocess.install_image(image_processor)
        ):
            self.overrides.add_undo(functools.partial(postprocess.uninstall, image_processor, "postprocess"))
        if family.prepare is not None:
            family.prepare(pipe, self)
        for name, entry in self.denoisers.items():
            module, chain = entry.module, self.chains[name]
            if self.pairing is not None:  # around the family's own wrappers: they see the batched pair
                chain.add(
                    "cfg_pairing", lambda inner, m=module, e=entry: self.pairing.wrap_denoiser(m, inner, e.hooked)
                )
                self.overrides.set(module, "cache_context", self.pairing.track_context(module, module.cache_context))
            chain.add("user_entry", self.user_entry)  # outermost: direct calls get host tensors

    def put_on_devices(self, name: str) -> None:
        """Place component ``name``'s weights as decided (sharded, quantized, the denoiser's blocks stacked); on a
        later call (``model_offload``) the same slots come back with the same shardings: no program recompiles."""
        module, slots, _ = self.decision.plans[name]
        if sharding.is_placed(module):
            return
        quantized = self.config.quantize is not None and name in self.family.denoisers
        if quantized:  # the host tensors, for an exact restore
            names = quantize.targets(module)
            originals = {slot.qualified: sharding.tensor_of(slot) for slot in slots if slot.qualified in names}
        mesh = self.vae_mesh if name == "vae" else self.mesh
        if self.config.in_host_memory(name):  # read where programs use them (``host_memory``)
            host_memory.place(module, slots, mesh, stack=name in self.family.denoisers and self.config.scan_blocks)
            return
        stacks = name in self.family.denoisers and self.config.scan_blocks
        if stacks and not quantized:  # stacked on the host, copied once: no program, no second copy on the devices
            stacked_weights.stack_from_host(module, slots, self.mesh, fully_shard=self.config.fully_sharded_weights)
        sharding.place(module, slots, mesh)
        if quantized:
            quantize.quantize_placed(module, slots, originals, self.config.quantize)
        if stacks:
            # repeated blocks' weights as one [N, ...] array each: the loop indexes them
            stacked_weights.stack(module, self.mesh, fully_shard=self.config.fully_sharded_weights)

    def denoiser_entry(self, module, rules, state=None) -> Denoiser:
        """The compiled entry of a denoiser (its activation constraints installed, undone on detach). ``state``:
        where its weights come from (default: the placed tensors; ``plan`` passes abstract ones)."""
        family = self.family
        forward = innermost_forward(module)
        if family.denoiser_forward is not None:
            forward = types.MethodType(family.denoiser_forward, module)
        handles = sharding.add_activation_constraints(module, family.activation_rules, self.mesh)
        for handle in handles:
            self.overrides.add_undo(handle.remove)
        return Denoiser(self, module, forward, rules, self.attention, self._batch_input, state=state)

    def _place_denoiser(self, name: str, module, rules) -> None:
        entry = self.denoiser_entry(module, rules)
        self.denoisers[name] = entry
        chain = self.chains[name] = forward_chain.ForwardChain(module, self.overrides)
        chain.add("program", lambda inner: entry, install=functools.partial(self._install_forward, module))
        chain.add("recording", self._recording_output)

    def chain_of(self, module) -> forward_chain.ForwardChain:
        """The declared layers around a denoiser's ``forward`` (``forward_chain``); for one the runtime has not
        placed (``plan``'s probe of the stock call), a chain of its own from here on."""
        for name, entry in self.denoisers.items():
            if entry.module is module:
                return self.chains[name]
        key = f"unplaced {id(module)}"
        if key not in self.chains:
            self.chains[key] = forward_chain.ForwardChain(module, self.overrides)
        return self.chains[key]

    def _install_forward(self, module, forward) -> None:
        """Install the innermost ``forward``: inside a diffusers hook chain registered before the move (so the hooks
        keep running around it), else as an instance attribute."""
        found = diffusers_private.innermost_forward_reference(module)
        if found is None:
            self.overrides.set(module, "forward", forward)
            return
        reference, attribute = found
        stock = getattr(reference, attribute)
        setattr(reference, attribute, forward)
        self.overrides.add_undo(lambda: setattr(reference, attribute, stock), f"{type(reference).__name__}.{attribute}")

    def enter_public_vae_methods(self, vae) -> None:
        """``vae.encode`` / ``vae.decode`` do tensor math around the compiled parts (slicing, tiling, the latent
        distribution): public entry points, so they also work (and return host tensors) outside a pipeline call."""
        for name in ("encode", "decode"):
            if callable(getattr(vae, name, None)):
                method = getattr(vae, name)
                if self.vae_mesh is not self.mesh:  # its outputs join the denoiser's mesh (``vae_mesh.onto_mesh``)
                    method = functools.wraps(method)(
                        lambda *a, _method=method, **k: vae_mesh.onto_mesh(_method(*a, **k), self.mesh)
                    )
                self.overrides.set(vae, name, self.user_entry(method))

    def vae_program_options(self) -> dict:
        """How every VAE program compiles (``jit.CompiledFunction`` options): on the VAE mesh, video inputs spatially
        sharded, and on several devices every video it returns or leaves in a feature cache too
        (``vae_mesh.spatially``). Left free, XLA's partitioner may replicate a whole VAE program (Wan's first decode
        program, CogVideoX's decoder with its carried conv cache: every device decoding everything; ``plan`` found
        both), or split a small cache entry over part of the mesh, which JAX then refuses. Built as
        ``TPUConfig.vae_compile`` says (``program_builds``)."""
        spatially = functools.partial(vae_mesh.spatially, mesh=self.vae_mesh) if self.vae_mesh.size > 1 else None
        config = self.config
        return dict(
            activate=functools.partial(self.active, None, self.vae_mesh),
            place_input=self.place_vae_input,
            place_output=spatially,
            build=program_builds.builder(
                config.vae_compile, self.target.platform, config.resolved_cache_dir(), self.store
            ),
        )

    def compiled_vae_method(self, owner, method: str, state):
        """A VAE method (``Family.vae_methods``) compiled as every VAE program is (``vae_program_options``)."""
        compiled = jit.CompiledFunction(owner, getattr(owner, method), state=state, **self.vae_program_options())
        self._compiled[(id(owner), method)] = compiled
        return compiled

    def compiled_of(self, module, method: str = "forward") -> jit.CompiledFunction:
        """The compiled method the runtime installed for ``module.<method>`` (a denoiser's: its whole-forward
        program), found by name whatever wraps it."""
        for entry in self.denoisers.values():
            if entry.module is module and method == "forward":
                return entry.whole
        if (id(module), method) not in self._compiled:
            raise KeyError(f"{type(module).__name__}.{method} is not compiled by this runtime")
        return self._compiled[(id(module), method)]

    def _jit(self, module, method, state, place_input=lambda a: a, settings=None):
        activate = functools.partial(self.active, settings)
        stock = getattr(module, method)
        compiled = jit.compiled_method(
            module, method, state=state, activate=activate, place_input=place_input, build=self.program_build
        )
        self._compiled[(id(module), method)] = compiled
        self.overrides.set(module, method, _EagerIfUntraceable(module, method, compiled, stock, activate))

    def undo(self) -> None:
        self.attached = False
        self.overrides.undo_all()


class _EagerIfUntraceable:
    """A compiled method, until a trace of it fails on Python-side use of its values (Stable Diffusion's safety
    checker reads its scores with ``.cpu().numpy()``): then the stock method runs eagerly on the devices from then
    on, as the denoiser does (``Denoiser._cannot_trace``) — the same results, op by op. Attributes are the compiled
    method's."""

    def __init__(self, module, method: str, compiled, stock, activate):
        self.compiled, self._stock, self._activate, self._eager = compiled, stock, activate, False
        self._name = f"{type(module).__name__}.{method}"

    def __call__(self, *args, **kwargs):
        if not self._eager:
            try:
                return self.compiled(*args, **kwargs)
            except TRACE_ERRORS as error:
                forget_unfinished(self.compiled)
                self._eager = True
                logger.warning(
                    "%s cannot be traced by JAX (%s); it now runs eagerly: the same results, slower.",
                    self._name,
                    type(error).__name__,
                )
        with self._activate():
            return self._stock(*user_tensors.to_device(args), **user_tensors.to_device(kwargs))

    def __getattr__(self, name):
        return getattr(self.compiled, name)


def _state(slots, prefix: str = "") -> dict:
    """A program's weights: each slot's array, or where it is stored otherwise than used (host memory) ``Gathered``."""
    state = {}
    for slot in slots:
        array = program_array(sharding.tensor_of(slot))
        state[slot.qualified[len(prefix) :]] = array if slot.gather is None else Gathered(array, slot.gather)
    return state


to_host = user_tensors.to_host  # callers' shorthand


def _autoencoder_parts(module) -> tuple[str, ...]:
    """A component other than ``vae`` that decodes and encodes through ``decoder``/``encoder`` submodules (an audio
    VAE): those parts are compiled like the VAE's, and ``encode``/``decode`` become public entry points, rather than
    compiling a ``forward`` the pipeline never calls."""
    if not (callable(getattr(module, "decode", None)) or callable(getattr(module, "encode", None))):
        return ()
    return vae_methods(module)


def attach(pipe, kind: str, config: TPUConfig | None = None, dtype: torch.dtype | None = None):
    """Validate, then place ``pipe`` on JAX. Raises before anything moves when something is wrong."""
    if config is not None and not isinstance(config, TPUConfig):
        raise ValueError(f"config must be a diffusers_tpu.TPUConfig, got {type(config).__name__}.")
    config = config or TPUConfig.from_environment()
    family = family_of(pipe)
    support.check(pipe, family.name)
    target = backend.resolve_target(kind)
    current = runtime_of(pipe)
    if current is not None and current.config == config and current.target == target and dtype is None:
        return pipe
    devices = backend.devices_for(target)
    if current is not None:
        detach(pipe)  # re-placing with another config starts from the torch pipeline
    for owner in shared_components.other_owners(pipe, current):
        shared_components.hand_over(owner, pipe, detach)
    shared_components.forget(pipe)
    # offload hooks, torch.compile wrappers (undone on failure/detach)
    prepared = gpu_script_calls.prepare_components(pipe)
    try:
        decided = decision.decide(pipe, config, target, devices, dtype, family=family)
    except BaseException:
        for step in reversed(prepared):
            step()
        raise
    backend.enable_compile_cache(config.resolved_cache_dir())
    runtime = PipelineRuntime(pipe, decided, dtype)
    for step in prepared:
        runtime.overrides.add_undo(step)
    denoisers = {c.name: c.module for c in decided.components if c.role == "denoiser"}
    gpu_script_calls.check_dtype(runtime, denoisers)
    try:
        with compile_accounting.compile_log() as placing:
            runtime.place(decided.plans)
        runtime.placing_programs = placing.compilations
    except BaseException:
        runtime.undo()
        raise
    vars(pipe)[_ATTR] = runtime
    logger.info("%s, attention %s", decided, runtime.attention.implementation)
    return pipe


def detach(pipe) -> None:
    runtime = vars(pipe).pop(_ATTR, None)
    if runtime is not None:
        runtime.undo()


def for_call(pipe) -> PipelineRuntime | None:
    """The runtime a call of ``pipe`` runs in: its own, or, when it handed its components to another pipeline
    (``shared_components``), a new one that takes them back as it was moved."""
    runtime = runtime_of(pipe)
    replaced = runtime.replaced_components() if runtime is not None else []
    if replaced:
        names = ", ".join(f"pipe.{name}" for name in replaced)
        logger.warning("%s replaced since pipe.to(%r): moving the pipeline again.", names, runtime.target.requested)
        kind, config, dtype = runtime.moved_with
        detach(pipe)  # the replaced module's state is restored on it; the new one is placed with the rest
        attach(pipe, kind, config=config, dtype=dtype)
        return runtime_of(pipe)
    how = shared_components.how_moved(pipe) if runtime is None else None
    if how is None:
        held = shared_components.held_elsewhere(pipe) if runtime is None else []
        denoisers = [n for n in held if n == "unet" or n.startswith("transformer")]
        if denoisers:  # built from a moved pipeline's denoiser (diffusers' ``Other(**components)``): it runs there
            owner = shared_components.owner(getattr(pipe, denoisers[0]))
            logger.warning(
                "%s of this %s are on JAX for another pipeline: this one moves there too, as that one was.",
                ", ".join(held),
                type(pipe).__name__,
            )
            kind, config, dtype = owner.moved_with
            attach(pipe, kind, config=config, dtype=dtype)
            return runtime_of(pipe)
        if held:
            raise ValueError(
                f"{', '.join(held)} of this {type(pipe).__name__} are on JAX for another pipeline that shares them, "
                "so plain torch cannot run it: move this pipeline there too (pipe.to('tpu') or pipe.to('jax')), or "
                "move the other one to 'cpu' first."
            )
        return runtime
    kind, config, dtype = how
    attach(pipe, kind, config=config, dtype=dtype)
    return runtime_of(pipe)


def leave_jax(pipe) -> None:
    """``pipe.to("cpu")``: detach it; a pipeline whose components another pipeline holds on JAX cannot take them
    to the host under that one: a clear error first."""
    detach(pipe)
    shared_components.forget(pipe)
    held = shared_components.held_elsewhere(pipe)
    if held:
        raise ValueError(
            f"{', '.join(held)} of this {type(pipe).__name__} are on JAX for another pipeline that shares them; move "
            "that pipeline to 'cpu' first (or call this one, which takes them back on JAX)."
        )


def cast(pipe, dtype: torch.dtype):
    """``pipe.to(dtype)`` while on JAX: cast every component on its devices."""
    runtime = runtime_of(pipe)
    for name, module in pipe.components.items():
        if not isinstance(module, torch.nn.Module):
            continue
        if sharding.is_placed(module):
            sharding.cast(module, dtype)
        else:
            module.to(dtype)
    runtime.user_dtype = dtype
    return pipe


def stats(pipe) -> CallStats:
    """Timings of the last call of a pipeline on JAX."""
    runtime = runtime_of(pipe)
    if runtime is None:
        raise ValueError("This pipeline is not on JAX; move it with pipe.to('tpu') or pipe.to('jax') first.")
    return runtime.last_call
