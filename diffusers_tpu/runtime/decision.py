"""What ``pipe.to("tpu")`` will do, decided once: ``decide`` gives a frozen, printable record that ``pipe.to``
(``moves.attach``) carries out and that ``plan``, ``cost`` and ``ready`` read for described TPU devices,
so the three cannot disagree.

It holds the family, the mesh (and the VAE's), where the text encoders run, every placed component's sharding
slots, rules and dtype, and the programs the runtime will compile for a call. Nothing moves and nothing compiles
while it is made; everything wrong with the pipeline or the config is raised here, before a weight moves.
"""

from __future__ import annotations

import dataclasses

import torch

from ..interop import backend, sharding
from . import text_encoder_placement
from .call.denoiser import runs_in_units
from .call.denoiser_hooks import check_hooks
from .config import TPUConfig
from .programs import program_builds
from .registry import Family, family_of
from .weights import host_memory, quantize

_FROM_DEVICES = object()  # decide(memory_limit=...): read the devices' own limit


@dataclasses.dataclass(frozen=True)
class ComponentPlan:
    """One component as it will be placed: its tensors' sharding slots, the family's rules, its dtype (None: as
    loaded), and how it is compiled (``role``)."""

    name: str
    module: torch.nn.Module = dataclasses.field(repr=False, compare=False)
    slots: tuple = dataclasses.field(repr=False)
    rules: tuple = dataclasses.field(repr=False)
    dtype: torch.dtype | None
    role: str  # "denoiser", "vae", "text encoder" (on the devices), "module"

    def weight_bytes_per_device(self, mesh_shape: dict, one_byte: frozenset = frozenset()) -> int:
        return text_encoder_placement.per_device_bytes(list(self.slots), mesh_shape, one_byte)


@dataclasses.dataclass(frozen=True)
class Decision:
    """Everything ``pipe.to`` will do on ``devices`` (module docstring)."""

    family: Family = dataclasses.field(repr=False)
    config: TPUConfig = dataclasses.field(repr=False)
    target: backend.Target
    devices: tuple = dataclasses.field(repr=False)
    mesh_shape: dict
    vae_mesh_shape: dict
    text_encoders: str  # "host" or "jax"
    components: tuple[ComponentPlan, ...]
    programs: tuple[str, ...]  # what a call compiles, by name

    @property
    def plans(self) -> dict:
        """``{name: (module, slots, rules)}``: what ``PipelineRuntime.place`` takes."""
        return {c.name: (c.module, list(c.slots), c.rules) for c in self.components}

    def component(self, name: str) -> ComponentPlan | None:
        return next((c for c in self.components if c.name == name), None)

    def __str__(self) -> str:
        where = "the devices" if self.text_encoders == "jax" else "the host"
        lines = [
            f"{self.family.name} on {self.target.platform} ({len(self.devices)} devices): mesh {self.mesh_shape}, "
            f"VAE mesh {self.vae_mesh_shape}, text encoders on {where}"
        ]
        for c in self.components:
            dtype = str(c.dtype).replace("torch.", "") if c.dtype is not None else "as loaded"
            lines.append(f"  {c.name}: {c.role}, {len(c.slots)} tensors, {dtype}")
        lines.append("  programs: " + ", ".join(self.programs))
        return "\n".join(lines)


def decide(
    pipe,
    config: TPUConfig,
    target: backend.Target,
    devices,
    dtype: torch.dtype | None = None,
    memory_limit=_FROM_DEVICES,
    family: Family | None = None,
) -> Decision:
    """The record of what ``pipe.to`` does with ``config`` on ``devices`` (real ones, simulated, or a TPU slice
    described for the TPU compiler). ``dtype``: a ``pipe.to(device, dtype)`` cast of every component;
    ``memory_limit``: the bytes a device can hold, for ``TPUConfig(text_encoder="auto")`` (default: what the
    devices report; ``plan`` gives its chip's); ``family``: the pipeline's, when the caller has it already. Raises
    what is wrong before anything moves."""
    family = family or family_of(pipe)
    devices = tuple(devices)
    if config.weights_in_host_memory:
        host_memory.check_devices(devices)
    modules = {n: m for n, m in pipe.components.items() if isinstance(m, torch.nn.Module)}
    text_encoders = text_encoder_placement.text_encoder_names(pipe)
    for name, module in modules.items():
        if name not in text_encoders or config.text_encoder == "jax":
            check_hooks(module, "pipe.to('tpu')")
    # a pipeline built without its denoiser (``encode_prompt`` on its own) has no heads for tp to divide
    heads = family.num_heads(pipe) if any(getattr(pipe, n, None) is not None for n in family.denoisers) else None
    if config.mesh is None:
        # a denoiser whose hooks keep the runtime from pairing the guidance calls runs them as two: no data axis to
        # pair over. A family that batches the pair itself (``family.cfg`` None: CogVideoX) keeps its batch of two.
        hooked = family.cfg is not None and any(runs_in_units(modules[n]) for n in family.denoisers if n in modules)
        # the first that splits every weight as the rules say; none does: the first, whose planning names the weight
        shapes = backend.default_mesh_shapes(len(devices), heads, pair_batch=not hooked)
        mesh_shape = next((shape for shape in shapes if splits_weights(pipe, shape, family)), shapes[0])
    else:
        mesh_shape = backend.validate_mesh_shape(config.mesh, len(devices), heads)
    limit = text_encoder_placement.device_memory_limit(devices) if memory_limit is _FROM_DEVICES else memory_limit
    encoders = _encoders(pipe, family, config, target, modules, mesh_shape, dtype, text_encoders, limit)
    placed = {n: m for n, m in modules.items() if encoders == "jax" or n not in text_encoders}
    components = tuple(_component_plans(family, config, target, placed, mesh_shape, dtype, text_encoders))
    return Decision(
        family=family,
        config=config,
        target=target,
        devices=devices,
        mesh_shape=dict(mesh_shape),
        vae_mesh_shape={"batch": 1, "spatial": len(devices)},
        text_encoders=encoders,
        components=components,
        programs=tuple(_programs(family, config, target, components)),
    )


def splits_weights(pipe, mesh_shape: dict, family: Family | None = None) -> bool:
    """Whether the denoisers' sharding rules can split their weights over ``mesh_shape`` (a small model's odd
    feed-forward width that tp=2 does not divide cannot): the automatic mesh and ``plan``'s candidates are such."""
    family = family or family_of(pipe)
    try:
        for name in family.denoisers:
            module = getattr(pipe, name, None)
            if isinstance(module, torch.nn.Module):
                sharding.plan(module, mesh_shape, family.rules(module, mesh_shape))
    except ValueError:
        return False
    return True


def weights_per_device(pipe, config: TPUConfig, platform: str, mesh_shape: dict, dtype=None) -> int:
    """Bytes of every component's weights (text encoders included) that one device holds as ``pipe.to`` places them
    on ``platform``: the figure ``TPUConfig(text_encoder="auto")`` decides on. Weights stored in host memory are
    held only while a program reads them: of those, the largest text encoder's (an encoder's program takes all of
    its weights at once) is counted."""
    family = family_of(pipe)
    modules = {n: m for n, m in pipe.components.items() if isinstance(m, torch.nn.Module)}
    target = backend.Target("tpu", platform)
    encoders = text_encoder_placement.text_encoder_names(pipe)
    total, encoding = 0, 0
    for plan in _component_plans(family, config, target, modules, mesh_shape, dtype, ()):
        quantized = config.quantize and plan.role == "denoiser"
        held = plan.weight_bytes_per_device(
            mesh_shape, frozenset(quantize.targets(plan.module)) if quantized else frozenset()
        )
        if not config.in_host_memory(plan.name):
            total += held
        elif plan.name in encoders:
            encoding = max(encoding, held)
    return total + encoding


def _encoders(pipe, family, config, target, modules, mesh_shape, dtype, text_encoders, limit) -> str:
    """``"host"`` or ``"jax"``: the config's, or for ``"auto"`` the rule of ``placement`` on the weights as they
    would be placed (nothing moves); a hook JAX refuses on an encoder keeps "auto" on the host."""
    if config.text_encoder != "auto":
        return config.text_encoder
    if limit is None or not text_encoders:
        return "host"
    choice = text_encoder_placement.choose(weights_per_device(pipe, config, target.platform, mesh_shape, dtype), limit)
    if choice == "jax":
        try:
            for name in text_encoders:
                check_hooks(modules[name], "pipe.to('tpu')")
        except ValueError:
            return "host"
    return choice


def component_dtype(family: Family, config: TPUConfig, target: backend.Target, name: str, default):
    """A component's dtype on the devices: ``TPUConfig.component_dtypes``, else the family's TPU default on TPU."""
    if config.component_dtypes is not None:
        return config.component_dtypes.get(name, default)
    if target.platform == "tpu":
        return family.tpu_dtypes.get(name, default)
    return default


def _component_plans(family, config, target, modules, mesh_shape, dtype, text_encoders):
    for name, module in modules.items():
        denoiser = name in family.denoisers
        rules = family.rules(module, mesh_shape) if denoiser else ()
        module_dtype = dtype if dtype is not None else (config.dtype if denoiser else None)
        if name == "vae" and config.vae_weights_dtype is not None:
            module_dtype = config.vae_weights_dtype
        if dtype is None:
            module_dtype = component_dtype(family, config, target, name, module_dtype)
        keep = (getattr(module, "_keep_in_fp32_modules", None) or ()) if dtype is None else ()
        slots = sharding.plan(module, mesh_shape, rules, module_dtype, keep)
        role = (
            "denoiser"
            if denoiser
            else "vae"
            if name == "vae"
            else "text encoder"
            if name in text_encoders
            else "module"
        )
        yield ComponentPlan(name, module, tuple(slots), tuple(rules), module_dtype, role)


def _programs(family, config, target, components) -> list[str]:
    """The programs a call compiles, by name (the eager glue between them aside)."""
    names = []
    for c in components:
        if c.role == "denoiser":
            names.append(f"{c.name} step")
        elif c.role == "vae":
            build = program_builds.resolve(config.vae_compile, target.platform)
            parts = family.vae_programs if family.vae_install is not None else family.vae_methods
            names += [f"vae {part} [{build}]" for part in parts]
        elif c.role == "text encoder":
            names.append(f"{c.name} forward")
    return names
