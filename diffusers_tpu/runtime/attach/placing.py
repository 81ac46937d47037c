"""How a moved pipeline's components are placed: weights on the devices as decided, the denoiser's compiled entry
and the layers around its ``forward``, the VAE's programs, every change recorded in the runtime's ledger
(``overrides``). ``PipelineRuntime`` holds these methods (``Placing`` is its mixin); ``moves.attach`` calls
``place`` once.
"""

from __future__ import annotations

import functools
import logging
import types

from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from ...interop import (
    jit,
    processes,
    sharding,
    user_tensors,
    vae_mesh,
)
from ...interop.host_stored import program_array
from ...interop.weights import Gathered
from .. import diffusers_private, text_encoder_placement
from ..call import hook_chain, postprocess, stock_on_host
from ..call.call_stats import timed_progress_bar
from ..call.denoiser import TRACE_ERRORS, Denoiser, forget_unfinished, innermost_forward
from ..programs import program_builds
from ..registry import vae_methods
from ..weights import host_memory, quantize, stacked_weights
from . import context_parallel, gpu_script_calls, shared_components

logger = logging.getLogger(__name__)


class Placing:
    """``PipelineRuntime``'s placement methods (the attributes they read are set in ``PipelineRuntime.__init__``)."""

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
                self.chain(module, "forward").register(hook_chain.UserEntry(self))
        host_encoders = text_encoder_placement.text_encoder_names(pipe) if self.text_encoder_placement == "host" else []
        for name in host_encoders:
            module = getattr(pipe, name)
            self.overrides.add_undo(shared_components.claim(self, module))
            self.chain(module, "forward").register(stock_on_host.OnHostModule(self))
            if self.user_dtype is not None:
                module.to(self.user_dtype)
        on_host = [
            name
            for name in stock_on_host.HOST_HELPERS
            if "device" in stock_on_host.parameters(getattr(pipe, name, None))
        ]
        if host_encoders and "device" in stock_on_host.parameters(getattr(pipe, "encode_prompt", None)):
            on_host.append("encode_prompt")
        for name in on_host:
            chain = self.chain(pipe, name)
            chain.register(stock_on_host.OnHost(chain.inner, self))
        if callable(getattr(pipe, "encode_prompt", None)):  # users call it too, e.g. to precompute embeddings
            encode_prompt = self.chain(pipe, "encode_prompt")
            encode_prompt.register(hook_chain.UserEntry(self))
            if self.pairing is not None:
                encode_prompt.register(self.pairing.negative_hook())
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
        for entry in self.denoisers.values():
            module, chain = entry.module, self.chain(entry.module)
            if self.pairing is not None:  # around the family's own hook: it sees the batched pair
                chain.register(self.pairing.denoiser_hook(module, entry.hook_route, entry.pair_answered))
                self.overrides.set(module, "cache_context", self.pairing.track_context(module, module.cache_context))
            chain.register(hook_chain.UserEntry(self))  # outermost: direct calls get host tensors

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
        self._install_forward(module, entry)
        self.chain(module, "forward").register(hook_chain.Recording(self))
        context_parallel.install(self, module)

    def chain(self, owner, method: str = "forward") -> hook_chain.HookChain:
        """The hooks around ``owner.<method>`` (``hook_chain``), installed over it at the first request."""
        key = (id(owner), method)
        if key not in self.chains:
            chain = self.chains[key] = hook_chain.HookChain(owner, method, lambda: self.attached)
            self.overrides.set(owner, method, chain)
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
                chain = self.chain(vae, name)
                chain.register(hook_chain.UserEntry(self))
                if self.vae_mesh is not self.mesh:  # its outputs join the denoiser's mesh
                    chain.register(hook_chain.OntoMesh(self.mesh))

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
            jax_context=functools.partial(self.jax_context, None, self.vae_mesh),
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
        jax_context = functools.partial(self.jax_context, settings)
        stock = getattr(module, method)
        compiled = jit.compiled_method(
            module, method, state=state, jax_context=jax_context, place_input=place_input, build=self.program_build
        )
        self._compiled[(id(module), method)] = compiled
        self.overrides.set(module, method, _EagerIfUntraceable(module, method, compiled, stock, jax_context))


def _state(slots, prefix: str = "") -> dict:
    """A program's weights: each slot's array, or where it is stored otherwise than used (host memory) ``Gathered``."""
    state = {}
    for slot in slots:
        array = program_array(sharding.tensor_of(slot))
        state[slot.qualified[len(prefix) :]] = array if slot.gather is None else Gathered(array, slot.gather)
    return state


def _autoencoder_parts(module) -> tuple[str, ...]:
    """A component other than ``vae`` that decodes and encodes through ``decoder``/``encoder`` submodules (an audio
    VAE): those parts are compiled like the VAE's, and ``encode``/``decode`` become public entry points, rather than
    compiling a ``forward`` the pipeline never calls."""
    if not (callable(getattr(module, "decode", None)) or callable(getattr(module, "encode", None))):
        return ()
    return vae_methods(module)


class _EagerIfUntraceable:
    """A compiled method, until a trace of it fails on Python-side use of its values (Stable Diffusion's safety
    checker reads its scores with ``.cpu().numpy()``): then the stock method runs eagerly on the devices from then
    on, as the denoiser does (``Denoiser._cannot_trace``) — the same results, op by op. Attributes are the compiled
    method's."""

    def __init__(self, module, method: str, compiled, stock, jax_context):
        self.compiled, self._stock, self._jax_context, self._eager = compiled, stock, jax_context, False
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
        with self._jax_context():
            return self._stock(*user_tensors.to_device(args), **user_tensors.to_device(kwargs))

    def __getattr__(self, name):
        return getattr(self.compiled, name)
