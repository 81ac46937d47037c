"""TPUConfig: every knob of the JAX placement in one small dataclass."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

import torch

from ..interop.mesh_axes import MESH_AXES
from ..kernels import BlockSizes
from .weights import quantize

ATTENTION_IMPLEMENTATIONS = ("splash_exp2", "splash", "xla", "cudnn")
TEXT_ENCODER_PLACEMENTS = ("auto", "host", "jax")
TEXT_PADDING_MODES = ("mask", "zero_kv")
MATMUL_PRECISIONS = ("highest", "high", "default")
VAE_COMPILE_MODES = ("auto", "quick", "full", "tiered")  # (runtime.program_builds reads them)
CONFIG_ENV = "DIFFUSERS_TPU_CONFIG"  # ``field=value,...``: the config of a ``pipe.to("tpu")`` that passes none
DEFAULT_CACHE_DIR = os.path.join(
    os.environ.get("XDG_CACHE_HOME", os.path.join(os.path.expanduser("~"), ".cache")), "diffusers_tpu", "jax"
)


@dataclasses.dataclass(frozen=True)
class TPUConfig:
    """How a pipeline runs on JAX. Every field has a working default; what each one means is written beside it."""

    # device-mesh axis sizes, e.g. ``{"dp": 2, "sp": 1, "tp": 4}``. ``dp`` shards the batch (the
    # classifier-free-guidance pair included), ``sp`` the token sequence, ``tp`` attention heads and MLP width. Missing
    # axes have size 1; the key order is the device layout order (default dp, sp, tp). The product must equal the number
    # of devices. ``None`` picks a layout from the device count and the model's head count.
    mesh: Mapping[str, int] | None = None
    # the denoiser's attention. ``"splash_exp2"``: the project's Pallas kernel (base-2 online softmax; interpret mode
    # off TPU); ``"splash"``: JAX's own Pallas splash kernel; ``"xla"``: plain reference attention; ``"cudnn"``: cuDNN
    # fused attention (NVIDIA GPUs). ``None``: splash_exp2 on TPU and CPU, cudnn on GPU. VAE and text-encoder attention
    # always runs the exact reference.
    attention: str | None = None
    # attention calls whose key/value length is at least this shard heads over ``tp`` (self-attention); shorter ones
    # (cross-attention to text) shard the query sequence instead (the Wan 2.1 TPU guide used 10000).
    attention_kv_threshold: int = 10000
    # ``diffusers_tpu.kernels.BlockSizes`` for "splash_exp2" (default: the guide's 3328/2816/256/256, clamped for short
    # sequences).
    attention_block_sizes: Any = None
    # subtract the mean key before "splash_exp2" (exact; steadier in bfloat16).
    attention_k_smoothing: bool = False
    # cast the denoiser weights to this dtype on the move, keeping the model's ``_keep_in_fp32_modules`` in float32 like
    # ``from_pretrained(torch_dtype=...)`` does.
    dtype: torch.dtype | None = None
    # ``"host"`` runs text encoders with plain torch on the host CPU (as the TPU reference projects do); ``"jax"`` moves
    # them to the devices and compiles them too. ``"auto"`` (default): on the devices when every component's weights
    # take at most 40% of a device's memory, else on the host; always on the host with CPU devices
    # (``runtime.placement`` has the rule and its reasons).
    text_encoder: str = "auto"
    # run the conditional and unconditional passes of classifier-free guidance as one batch. ``"auto"``: when ``dp >=
    # 2`` (each half on its own devices).
    batch_cfg: bool | str = "auto"
    # denormalize, quantize and lay out frames on the device, so "pil" output moves uint8 (a quarter of the float bytes)
    # to the host.
    postprocess_on_device: bool = True
    # run ``scheduler.step`` (and ``scale_model_input``) as compiled programs, the scheduler's state carried through
    # them (``runtime/call/scheduler_steps.py``); False: op by op, as before. Within the parity bounds either way.
    compile_scheduler: bool = True
    # JAX persistent compilation cache directory; ``None`` means the default user cache dir (or
    # ``$DIFFUSERS_TPU_CACHE_DIR``), ``False`` disables it.
    compile_cache_dir: str | bool | None = None
    # a folder of programs built ahead (``diffusers-tpu compile``, or an earlier run with this setting): each program is
    # loaded from it when one was built for exactly this program, versions, devices and flags, else compiled — and
    # written there (``runtime.program_store``). Load only folders you built: a stored program is code.
    programs: str | None = None
    # latent frames per compiled VAE chunk (Wan): one program serves every frame count; larger chunks mean fewer calls
    # but up to ``chunk - 1`` frames of padding.
    vae_decode_chunk: int = 1
    vae_encode_chunk: int = 1
    # how hard XLA works on the VAE's programs (``runtime.program_builds``). ``"quick"``: XLA's compile effort -1 — the
    # TPU compiler builds a 3-D VAE decoder in a fraction of its default minutes; same results (precision unchanged),
    # run time on a TPU not measured yet. ``"full"``: XLA's default effort. ``"tiered"``: quick at once, the full build
    # on a background thread, swapped in when built (and when it fits the devices' free memory). ``"auto"``: quick on
    # TPU, full elsewhere (the effort changes nothing on CPU).
    vae_compile: str = "auto"
    # the VAE's compute dtype (weights are cast inside the compiled program); None: its weights'.
    vae_dtype: torch.dtype | None = None
    # the VAE weights' dtype on the devices (bfloat16 halves their memory); None: as loaded.
    vae_weights_dtype: torch.dtype | None = None
    # the dtype the scheduler keeps latents in between steps; None: as the pipeline does.
    scheduler_dtype: torch.dtype | None = None
    # dtype of named components on the devices, e.g. ``{"text_encoder_2": torch.bfloat16}``; None: the family's TPU
    # defaults on TPU (HunyuanVideo-1.5: ByT5 in bfloat16), as loaded elsewhere.
    component_dtypes: Mapping[str, torch.dtype] | None = None
    # how padded text tokens stay out of attention (HunyuanVideo-1.5). ``"mask"``: exactly, as a key mask in the kernel;
    # ``"zero_kv"``: their keys and values are zeroed, an approximation (padded keys still take softmax weight) that TPU
    # ports used before kernels had a key mask.
    text_padding: str = "mask"
    # how float32 matrix products and convolutions run (JAX's ``default_matmul_precision``). ``"highest"``: full
    # float32, like stock torch on the CPU, so float32 parts match stock. ``"default"``: the platform's fast path — one
    # bfloat16 pass on TPU, TF32 on NVIDIA GPUs — faster for float32 parts (the float32 VAE), but their results move
    # ~1e-3 away from stock; ``"high"`` lies between. bfloat16 operands are exact either way.
    matmul_precision: str = "highest"
    # ``"int8"`` stores the denoiser's linear weights as int8 with per-output-channel scales (half the bytes of
    # bfloat16), rebuilt in the compute dtype inside each compiled matmul; activations untouched. ``"fp8"``:
    # float8_e4m3fn storage the same way. ``None`` (default): weights as placed. Lossy: see BENCHMARKS.md "int8 weights"
    # for the measured error.
    quantize: str | None = None
    # trace a denoiser's stack of identical blocks as one loop over their weights, so XLA compiles the block once
    # instead of once per layer (``runtime.repeated_blocks``; the same results). False: the stock loop unrolled, every
    # layer its own copy in the program.
    scan_blocks: bool = True
    # store those blocks' weights sharded over every mesh axis, not only the ones their tensor-parallel rules use
    # (``runtime.stacked_weights.fully_sharded``); the loop gathers each layer where it reads it. Weights per device
    # shrink by the size of the data and sequence axes; each step all-gathers every layer's weights once (FSDP's trade).
    # Needs ``scan_blocks``; the results are the same.
    fully_sharded_weights: bool = False
    # keep every placed component's weights in the host's memory (JAX's ``pinned_host`` memory kind) and bring them to
    # the devices where a program reads them: a denoiser's repeated blocks one layer at a time inside the loop, the
    # other weights when the program starts (``runtime.host_memory``). Device memory then holds about one layer of
    # blocks instead of the whole model, for host-to-device traffic on every step. A tuple of component names: those
    # only. What ``pipe.enable_sequential_cpu_offload(device="tpu")`` (all) and ``enable_group_offload`` (the
    # components it names) turn on; the results are the same.
    weights_in_host_memory: bool | tuple[str, ...] = False

    def __post_init__(self):
        if self.mesh is not None:
            if not isinstance(self.mesh, Mapping):
                raise ValueError(
                    f"TPUConfig(mesh=...) must be a dict of axis sizes such as {{'dp': 2, 'sp': 1, 'tp': 4}}, "
                    f"got {self.mesh!r}."
                )
            unknown = [axis for axis in self.mesh if axis not in MESH_AXES]
            if unknown:
                raise ValueError(f"TPUConfig(mesh=...) has unknown axes {unknown}; the axes are {list(MESH_AXES)}.")
            bad = {a: s for a, s in self.mesh.items() if isinstance(s, bool) or not isinstance(s, int) or s < 1}
            if bad:
                raise ValueError(f"TPUConfig(mesh=...) sizes must be positive integers, got {bad}.")
            object.__setattr__(self, "mesh", dict(self.mesh))
        if self.attention is not None and self.attention not in ATTENTION_IMPLEMENTATIONS:
            raise ValueError(
                f"TPUConfig(attention={self.attention!r}) is not an attention implementation; "
                f"choose one of {list(ATTENTION_IMPLEMENTATIONS)} (or None for the platform default)."
            )
        if (
            isinstance(self.attention_kv_threshold, bool)
            or not isinstance(self.attention_kv_threshold, int)
            or (self.attention_kv_threshold < 0)
        ):
            raise ValueError(
                f"TPUConfig(attention_kv_threshold={self.attention_kv_threshold!r}) must be a non-negative int."
            )
        if self.attention_block_sizes is not None:
            if not isinstance(self.attention_block_sizes, BlockSizes):
                raise ValueError(
                    "TPUConfig(attention_block_sizes=...) must be a diffusers_tpu.kernels.BlockSizes, e.g. "
                    f"BlockSizes(block_q=1024, block_kv=1024), got {self.attention_block_sizes!r}."
                )
        if not isinstance(self.scan_blocks, bool):
            raise ValueError(f"TPUConfig(scan_blocks={self.scan_blocks!r}) must be a bool.")
        if not isinstance(self.fully_sharded_weights, bool):
            raise ValueError(f"TPUConfig(fully_sharded_weights={self.fully_sharded_weights!r}) must be a bool.")
        if self.fully_sharded_weights and not self.scan_blocks:
            raise ValueError(
                "TPUConfig(fully_sharded_weights=True) shards the repeated blocks' stacked weights and "
                "needs scan_blocks=True (the default); drop scan_blocks=False."
            )
        names = self.weights_in_host_memory
        if not isinstance(names, bool):
            if isinstance(names, str) or not all(isinstance(n, str) for n in getattr(names, "__iter__", lambda: [0])()):
                raise ValueError(
                    f"TPUConfig(weights_in_host_memory={names!r}) must be a bool or a tuple of component names "
                    "such as ('transformer', 'text_encoder')."
                )
            object.__setattr__(self, "weights_in_host_memory", tuple(sorted(set(names))) or False)
        if self.weights_in_host_memory and (self.fully_sharded_weights or self.quantize is not None):
            raise ValueError(
                "TPUConfig(weights_in_host_memory=True) keeps the weights as placed in the host's memory; it does not "
                "combine with fully_sharded_weights or quantize: drop one of them."
            )
        if not isinstance(self.attention_k_smoothing, bool):
            raise ValueError(f"TPUConfig(attention_k_smoothing={self.attention_k_smoothing!r}) must be a bool.")
        if self.dtype is not None and not (isinstance(self.dtype, torch.dtype) and self.dtype.is_floating_point):
            raise ValueError(
                f"TPUConfig(dtype={self.dtype!r}) must be a floating torch dtype such as torch.bfloat16, or None."
            )
        if self.text_encoder not in TEXT_ENCODER_PLACEMENTS:
            raise ValueError(
                f"TPUConfig(text_encoder={self.text_encoder!r}) must be one of {list(TEXT_ENCODER_PLACEMENTS)}."
            )
        if self.batch_cfg not in (True, False, "auto"):
            raise ValueError(f"TPUConfig(batch_cfg={self.batch_cfg!r}) must be True, False or 'auto'.")
        if not isinstance(self.postprocess_on_device, bool):
            raise ValueError(f"TPUConfig(postprocess_on_device={self.postprocess_on_device!r}) must be a bool.")
        if not isinstance(self.compile_scheduler, bool):
            raise ValueError(f"TPUConfig(compile_scheduler={self.compile_scheduler!r}) must be a bool.")
        for name in ("vae_decode_chunk", "vae_encode_chunk"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"TPUConfig({name}={value!r}) must be a positive number of latent frames.")
        for name in ("vae_dtype", "vae_weights_dtype", "scheduler_dtype"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, torch.dtype) and value.is_floating_point):
                raise ValueError(
                    f"TPUConfig({name}={value!r}) must be a floating torch dtype (e.g. torch.bfloat16) or None."
                )
        if self.component_dtypes is not None:
            if not isinstance(self.component_dtypes, Mapping) or not all(
                isinstance(k, str) and isinstance(v, torch.dtype) and v.is_floating_point
                for k, v in self.component_dtypes.items()
            ):
                raise ValueError(
                    f"TPUConfig(component_dtypes={self.component_dtypes!r}) must map component names to floating "
                    "torch dtypes, e.g. {'text_encoder_2': torch.bfloat16}."
                )
            object.__setattr__(self, "component_dtypes", dict(self.component_dtypes))
        if self.text_padding not in TEXT_PADDING_MODES:
            raise ValueError(
                f"TPUConfig(text_padding={self.text_padding!r}) must be one of {list(TEXT_PADDING_MODES)}."
            )
        if self.vae_compile not in VAE_COMPILE_MODES:
            raise ValueError(f"TPUConfig(vae_compile={self.vae_compile!r}) must be one of {list(VAE_COMPILE_MODES)}.")
        if self.matmul_precision not in MATMUL_PRECISIONS:
            raise ValueError(
                f"TPUConfig(matmul_precision={self.matmul_precision!r}) must be one of {list(MATMUL_PRECISIONS)}."
            )

        quantize.check_format(self.quantize)
        if self.programs is not None and not isinstance(self.programs, (str, os.PathLike)):
            raise ValueError(f"TPUConfig(programs={self.programs!r}) must be a folder path or None.")
        if self.programs is not None:
            object.__setattr__(self, "programs", os.fspath(self.programs))
            if os.path.exists(self.programs) and not os.path.isdir(self.programs):
                raise ValueError(
                    f"TPUConfig(programs={self.programs!r}) is a file, not a folder: name a folder (created if "
                    "missing) for the programs built ahead."
                )
        if self.compile_cache_dir not in (None, False) and not isinstance(self.compile_cache_dir, (str, os.PathLike)):
            raise ValueError(
                f"TPUConfig(compile_cache_dir={self.compile_cache_dir!r}) must be a path, None (default) or False."
            )
        if self.compile_cache_dir not in (None, False) and os.path.isfile(self.compile_cache_dir):
            raise ValueError(
                f"TPUConfig(compile_cache_dir={self.compile_cache_dir!r}) is a file, not a folder: name a folder "
                "(created if missing), or False for no cache."
            )

    def attention_for(self, platform: str) -> str:
        """The denoiser attention on a JAX platform; raises when the choice cannot run there."""
        choice = self.attention or ("cudnn" if platform == "gpu" else "splash_exp2")
        if choice == "cudnn" and platform != "gpu":
            raise ValueError(
                f"TPUConfig(attention='cudnn') needs an NVIDIA GPU platform, but this pipeline goes to {platform}; "
                "use 'splash_exp2' (TPU, or interpret mode on CPU) or 'xla'."
            )
        if choice.startswith("splash") and platform == "gpu":
            raise ValueError(
                f"TPUConfig(attention={choice!r}) is a TPU Pallas kernel and cannot run on a GPU; use 'cudnn' "
                "(the GPU default) or 'xla'."
            )
        return choice

    def in_host_memory(self, component: str) -> bool:
        """Whether ``component``'s weights are stored in host memory (``weights_in_host_memory``)."""
        names = self.weights_in_host_memory
        return names is True or (names is not False and component in names)

    def replace(self, **changes: Any) -> TPUConfig:
        return dataclasses.replace(self, **changes)

    def resolved_cache_dir(self) -> str | None:
        if self.compile_cache_dir is False:
            return None
        if self.compile_cache_dir is None:
            return os.environ.get("DIFFUSERS_TPU_CACHE_DIR") or DEFAULT_CACHE_DIR
        return os.fspath(self.compile_cache_dir)

    @classmethod
    def from_environment(cls) -> TPUConfig:
        """The config ``pipe.to("tpu")`` uses when the call passes none: the defaults, with the fields that
        ``$DIFFUSERS_TPU_CONFIG`` sets (``text_encoder=jax,vae_compile=full``), so an unchanged script (or a test
        suite) can be tuned from outside. Fields whose value is a word, a number or a bool only."""
        text = os.environ.get(CONFIG_ENV, "").strip()
        if not text:
            return cls()
        settings = _parse_settings(text)
        try:
            return cls(**settings)
        except ValueError as error:
            raise ValueError(f"{CONFIG_ENV}={text!r}: {error}") from None


def _parse_settings(text: str) -> dict:
    simple = {
        f.name: f.default for f in dataclasses.fields(TPUConfig) if isinstance(f.default, (str, bool, int, type(None)))
    }
    simple = {name: default for name, default in simple.items() if name not in _NOT_FROM_TEXT}
    settings = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, equals, value = (part.strip() for part in item.partition("="))
        if not equals or name not in simple:
            raise ValueError(
                f"{CONFIG_ENV}={text!r}: {item!r} is not field=value of a TPUConfig field that takes a word, number or "
                f"bool ({', '.join(sorted(simple))}); set the others with pipe.to('tpu', config=TPUConfig(...))."
            )
        default = simple[name]
        if value.lower() in ("none", "null") and not isinstance(default, bool):
            settings[name] = None
        elif isinstance(default, bool) or value.lower() in ("true", "false"):
            settings[name] = {"true": True, "false": False}.get(value.lower(), value)
        elif isinstance(default, int):
            settings[name] = int(value) if value.lstrip("-").isdigit() else value
        else:
            settings[name] = value
    return settings


# fields a word cannot state (they take objects: a mesh, dtypes, block sizes)
_NOT_FROM_TEXT = frozenset(
    {"mesh", "attention_block_sizes", "dtype", "component_dtypes", "vae_dtype", "vae_weights_dtype", "scheduler_dtype"}
)
