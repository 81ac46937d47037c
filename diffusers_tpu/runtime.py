"""Attach a stock diffusers pipeline to JAX (place, shard, compile) and detach it again.

``pipe.to("tpu")`` lands in ``attach``: it validates everything (platform, family, mesh, sharding plans)
before a single weight moves, then places each component, installs per-instance overrides and records them,
so ``pipe.to("cpu")`` (``detach``) restores the plain torch pipeline exactly.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import logging
import time
import types

import jax
import torch
import torch.utils._pytree as pytree
from jax.sharding import NamedSharding, PartitionSpec as P

import diffusers

from . import attention, backend, cfg, compile as jit, patches, postprocess, schedulers, sharding
from .config import TPUConfig
from .families import Family, family_of

logger = logging.getLogger(__name__)
_ATTR = "_diffusers_tpu_runtime"


# --- reading pipe.to(...) arguments ----------------------------------------------------------------------
def _device_arg(args, kwargs):
    if "device" in kwargs:
        return kwargs["device"]
    return args[0] if args and not isinstance(args[0], torch.dtype) else None


def jax_target_of(args, kwargs) -> str | None:
    return backend.parse_device(_device_arg(args, kwargs))


def dtype_of(args, kwargs) -> torch.dtype | None:
    if "dtype" in kwargs:
        return kwargs["dtype"]
    return next((a for a in args[:2] if isinstance(a, torch.dtype)), None)


def is_dtype_only(args, kwargs) -> bool:
    return _device_arg(args, kwargs) is None and dtype_of(args, kwargs) is not None


def runtime_of(pipe) -> PipelineRuntime | None:
    return vars(pipe).get(_ATTR)


def is_attached(pipe) -> bool:
    return runtime_of(pipe) is not None


@dataclasses.dataclass
class CallStats:
    """Timings of the last pipeline call. Step times wait for the device (block_until_ready)."""

    total_seconds: float = 0.0
    compile_seconds: float = 0.0
    compilations: int = 0
    cache_hits: int = 0
    step_seconds: list[float] = dataclasses.field(default_factory=list)

    @property
    def run_seconds(self) -> float:
        return max(self.total_seconds - self.compile_seconds, 0.0)

    def summary(self) -> str:
        steps = self.step_seconds
        per_step = f", {sum(steps[1:]) / (len(steps) - 1):.3f} s/step warm" if len(steps) > 1 else ""
        return (
            f"compile {self.compile_seconds:.2f} s ({self.compilations} programs, {self.cache_hits} from the "
            f"persistent cache), run {self.run_seconds:.2f} s"
            f"{per_step}, total {self.total_seconds:.2f} s"
        )


class PipelineRuntime:
    def __init__(self, pipe, family: Family, config: TPUConfig, target: backend.Target, mesh, user_dtype):
        self.pipe, self.family, self.config, self.target, self.mesh = pipe, family, config, target, mesh
        # The VAE runs on its own mesh over the same devices: a redundant batch axis x a spatial axis.
        self.vae_mesh = backend.build_mesh({"batch": 1, "spatial": mesh.size}, list(mesh.devices.flat))
        self.user_dtype = user_dtype
        self.attention = attention.AttentionSettings(
            mesh, config.attention_for(target.platform), config.attention_kv_threshold,
            config.attention_block_sizes, config.attention_k_smoothing,
        )
        batch_cfg = config.batch_cfg == "auto" and mesh.shape["dp"] >= 2 or config.batch_cfg is True
        self.pairing = cfg.CFGPairing(family.cfg_condition_arg, family.cfg_batched_args) if (
            batch_cfg and family.cfg_negative is not None
        ) else None
        self.last_call = CallStats()
        self._undo: list = []
        self._last_output = None
        self._log: jit.CompileLog | None = None
        self._in_call = False

    # -- context every JAX call runs in --------------------------------------------------------------------
    @contextlib.contextmanager
    def active(self, settings: attention.AttentionSettings | None = None):
        """The context JAX calls run in; ``settings``: the attention of the module being called (default: safe)."""
        with backend.jax_mode(), attention.use(settings or attention.SAFE), jax.default_device(self.mesh.devices.flat[0]):
            yield

    def run_pipeline_call(self, stock_call, pipe, args, kwargs):
        if self._in_call:  # a subclass __call__ wrapping the stock one
            return stock_call(pipe, *args, **kwargs)
        if self.family.check_call is not None:  # bad input fails here, before anything compiles
            bound = inspect.signature(stock_call).bind(pipe, *args, **kwargs)
            bound.apply_defaults()
            self.family.check_call(pipe, bound.arguments)
        self._in_call, self.last_call = True, CallStats()
        if self.pairing:
            self.pairing.reset()
        start = time.perf_counter()
        try:
            with self.active(), jit.compile_log() as log:
                self._log = log
                out = to_host(stock_call(pipe, *args, **kwargs))
        finally:
            self._in_call, self._last_output, self._log = False, None, None
        self.last_call.total_seconds = time.perf_counter() - start
        self.last_call.compile_seconds, self.last_call.compilations = log.seconds, log.compilations
        self.last_call.cache_hits = log.cache_hits
        logger.info("%s on %s: %s", type(pipe).__name__, self.target.platform, self.last_call.summary())
        return out

    # -- placement -------------------------------------------------------------------------------------------
    def _batch_input(self, array):
        if array.ndim and array.shape[0] % self.mesh.shape["dp"] == 0:
            return jax.device_put(array, NamedSharding(self.mesh, P("dp")))
        return jax.device_put(array, NamedSharding(self.mesh, P()))

    def _width_input(self, array):
        """VAE inputs on the VAE's own mesh: width over every device when it divides, else height, else whole."""
        mesh = self.vae_mesh
        if array.ndim == 5 and array.shape[-1] % mesh.size == 0:
            return jax.device_put(array, NamedSharding(mesh, P(None, None, None, None, "spatial")))
        if array.ndim == 5 and array.shape[-2] % mesh.size == 0:
            return jax.device_put(array, NamedSharding(mesh, P(None, None, None, "spatial", None)))
        return jax.device_put(array, NamedSharding(mesh, P()))

    def _recording_output(self, forward):
        def recorded(*args, **kwargs):
            out = forward(*args, **kwargs)
            self._last_output = out
            return out

        recorded.__wrapped__ = forward
        return recorded

    def place(self, plans: dict) -> None:
        pipe, family = self.pipe, self.family
        for name, (module, slots) in plans.items():
            sharding.place(module, slots, self.vae_mesh if name == "vae" else self.mesh)
            self._undo.append(functools.partial(sharding.restore, module))
            self._override(module, "state_dict", _host_state_dict(module.state_dict))
            state = functools.partial(_state, slots)
            if name in family.denoisers:
                if family.denoiser_forward is not None:
                    self._override(module, "forward", types.MethodType(family.denoiser_forward, module))
                handles = sharding.add_activation_constraints(module, family.activation_rules, self.mesh)
                self._undo.extend(handle.remove for handle in handles)
                self._jit(module, "forward", state, self._batch_input, self.attention)
                self._override(module, "forward", self._recording_output(module.forward))
                if self.pairing is not None:
                    self._override(module, "forward", self.pairing.wrap_denoiser(module, module.forward))
                    self._override(module, "cache_context", self.pairing.track_context(module, module.cache_context))
            elif name == "vae" and family.vae_install is not None:
                family.vae_install(module, self, state, self._width_input)
            elif name == "vae":
                for spec in family.vae_methods:
                    path, _, method = spec.rpartition(".")
                    owner = module.get_submodule(path) if path else module
                    prefix = f"{path}." if path else ""
                    owned = functools.partial(_state, [s for s in slots if s.qualified.startswith(prefix)], prefix)
                    self._jit(owner, method, owned, self._width_input)
                self.enter_public_vae_methods(module)
            else:
                self._jit(module, "forward", state)
        for scheduler in (c for c in pipe.components.values() if isinstance(c, diffusers.SchedulerMixin)):
            self._undo.extend(schedulers.place(scheduler))
            if self.config.scheduler_dtype is not None:
                self._undo.extend(schedulers.keep_dtype(scheduler, self.config.scheduler_dtype))
        for name in _host_text_encoders(pipe, self.config):
            module = getattr(pipe, name)
            self._override(module, "forward", _on_host(module.forward))
            if self.user_dtype is not None:
                module.to(self.user_dtype)
        if self.pairing is not None:
            self._override(pipe, "encode_prompt", self.pairing.capture_negative(pipe.encode_prompt, family.cfg_negative))
        if callable(getattr(pipe, "encode_prompt", None)):  # users call it too, e.g. to precompute embeddings
            self._override(pipe, "encode_prompt", self._entered(pipe.encode_prompt))
        self._override(pipe, "progress_bar", self._timed_progress_bar(pipe.progress_bar))
        processor = getattr(pipe, "video_processor", None)
        if self.config.postprocess_on_device and processor is not None:
            postprocess.install(processor)
            self._undo.append(functools.partial(postprocess.uninstall, processor))
        if family.prepare is not None:
            family.prepare(pipe, self)

    def enter_public_vae_methods(self, vae) -> None:
        """``vae.encode`` / ``vae.decode`` do tensor math around the compiled parts (slicing, tiling, the latent
        distribution): run them in the JAX context, so they also work when called outside a pipeline call."""
        for name in ("encode", "decode"):
            if callable(getattr(vae, name, None)):
                self._override(vae, name, self._entered(getattr(vae, name)))

    def _entered(self, method):
        @functools.wraps(method)
        def entered(*args, **kwargs):
            with self.active():
                return method(*args, **kwargs)

        return entered

    def _jit(self, module, method, state, place_input=lambda a: a, settings=None):
        activate = functools.partial(self.active, settings)
        compiled = jit.compiled_method(module, method, state=state, activate=activate, place_input=place_input)
        self._override(module, method, compiled)

    def _override(self, owner, name, value):
        had = name in vars(owner)
        previous = vars(owner).get(name)
        object.__setattr__(owner, name, value)

        def undo():
            if had:
                object.__setattr__(owner, name, previous)
            else:
                vars(owner).pop(name, None)

        self._undo.append(undo)

    def undo(self) -> None:
        for step in reversed(self._undo):
            step()
        self._undo.clear()

    # -- progress bar: per-step device time, compile reported apart -----------------------------------------
    def _timed_progress_bar(self, stock_progress_bar):
        runtime = self

        def progress_bar(iterable=None, total=None):
            bar = stock_progress_bar(iterable=iterable, total=total)
            if iterable is not None:
                return bar
            stock_update = bar.update
            marks = {"last": time.perf_counter(), "compile": 0.0}

            def update(n=1):
                if runtime._last_output is not None:
                    jax.block_until_ready(pytree.tree_map(backend.to_jax_array, runtime._last_output))
                now = time.perf_counter()
                seconds, marks["last"] = now - marks["last"], now
                compile_now = runtime._log.seconds if runtime._log is not None else 0.0
                compiled, marks["compile"] = compile_now - marks["compile"], compile_now
                runtime.last_call.step_seconds.append(seconds)
                if hasattr(bar, "start_t"):  # a disabled bar has no clock
                    bar.start_t += compiled  # rate and ETA count device time, not compilation
                warm = runtime.last_call.step_seconds[1:] or runtime.last_call.step_seconds
                bar.set_postfix(step=f"{seconds:.3f}s", avg=f"{sum(warm) / len(warm):.3f}s",
                                compile=f"{compile_now:.1f}s", refresh=False)
                return stock_update(n)

            bar.update = update
            return bar

        return progress_bar


def _state(slots, prefix: str = "") -> dict:
    return {slot.qualified[len(prefix):]: sharding._get(slot).jax() for slot in slots}


def _host_state_dict(state_dict):
    """``state_dict()`` of a placed module as host tensors (gathered), so ``save_pretrained`` works on JAX."""

    def host_state_dict(*args, **kwargs):
        result = state_dict(*args, **kwargs)
        for key, value in result.items():
            result[key] = _to_cpu(value)
        return result

    host_state_dict.__wrapped__ = state_dict
    return host_state_dict


def _on_host(forward):
    """Run a module with plain torch on the host, whatever device its inputs sit on."""

    def host_forward(*args, **kwargs):
        with backend.torch_mode():
            args, kwargs = pytree.tree_map(_to_cpu, (args, kwargs))
            return forward(*args, **kwargs)

    host_forward.__wrapped__ = forward
    return host_forward


def _to_cpu(value):
    return backend.jax_to_host(value.jax()) if backend.is_jax_tensor(value) else value


def to_host(value):
    """Pipeline outputs as the user can use them: JAX tensors become CPU torch tensors."""
    return pytree.tree_map(_to_cpu, value)


def _host_text_encoders(pipe, config: TPUConfig) -> list[str]:
    if config.text_encoder != "host":
        return []
    return [n for n, m in pipe.components.items() if n.startswith("text_encoder") and isinstance(m, torch.nn.Module)]


def _modules_to_place(pipe, config: TPUConfig) -> dict:
    host = set(_host_text_encoders(pipe, config))
    return {n: m for n, m in pipe.components.items() if isinstance(m, torch.nn.Module) and n not in host}


def component_dtype(family: Family, config: TPUConfig, target: backend.Target, name: str, default):
    """A component's dtype on the devices: ``TPUConfig.component_dtypes``, else the family's TPU default on TPU."""
    if config.component_dtypes is not None:
        return config.component_dtypes.get(name, default)
    if target.platform == "tpu":
        return family.tpu_dtypes.get(name, default)
    return default


def attach(pipe, kind: str, config: TPUConfig | None = None, dtype: torch.dtype | None = None):
    """Validate, then place ``pipe`` on JAX. Raises before anything moves when something is wrong."""
    if config is not None and not isinstance(config, TPUConfig):
        raise ValueError(f"config must be a diffusers_tpu.TPUConfig, got {type(config).__name__}.")
    config = config or TPUConfig()
    family = family_of(pipe)
    target = backend.resolve_target(kind)
    current = runtime_of(pipe)
    if current is not None and current.config == config and current.target == target and dtype is None:
        return pipe
    devices = backend.devices_for(target)
    heads = family.num_heads(pipe)
    if config.mesh is None:
        mesh_shape = backend.default_mesh_shape(len(devices), heads)
    else:
        mesh_shape = backend.validate_mesh_shape(config.mesh, len(devices), heads)
    if current is not None:
        detach(pipe)  # re-placing with another config starts from the torch pipeline
    plans = {}
    for name, module in _modules_to_place(pipe, config).items():
        denoiser = name in family.denoisers
        rules = family.shard_rules if denoiser else ()
        module_dtype = dtype if dtype is not None else (config.dtype if denoiser else None)
        if name == "vae" and config.vae_weights_dtype is not None:
            module_dtype = config.vae_weights_dtype
        if dtype is None:
            module_dtype = component_dtype(family, config, target, name, module_dtype)
        keep = (getattr(module, "_keep_in_fp32_modules", None) or ()) if dtype is None else ()
        plans[name] = (module, sharding.plan(module, mesh_shape, rules, module_dtype, keep))

    patches.wrap_pipeline_call(type(pipe))
    backend.enable_compile_cache(config.resolved_cache_dir())
    mesh = backend.build_mesh(mesh_shape, devices)
    runtime = PipelineRuntime(pipe, family, config, target, mesh, dtype)
    try:
        runtime.place(plans)
    except BaseException:
        runtime.undo()
        raise
    vars(pipe)[_ATTR] = runtime
    logger.info("%s on %s, mesh %s, attention %s", type(pipe).__name__, target.platform, mesh_shape,
                runtime.attention.implementation)
    return pipe


def detach(pipe) -> None:
    runtime = vars(pipe).pop(_ATTR, None)
    if runtime is not None:
        runtime.undo()


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
