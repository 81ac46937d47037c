"""Sharded loading: a pipeline's denoiser read from its safetensors files slice by slice, straight into the device
shards, without a whole host copy of the model.

``from_pretrained`` builds each denoiser with empty (meta) parameters from its config, checks the checkpoint against
it (files present and readable, every weight there with its shape) before any device is touched, loads the other
components as stock, then moves the pipeline: at placement each parameter becomes a global array whose shards are read
by ``safe_open(...).get_slice(name)[index]`` for the devices of this process only (``jax.make_array_from_callback``),
cast to the target dtype on the way. Host memory stays near the largest single tensor, not the model size.
"""

from __future__ import annotations

import json
import os

import diffusers
import jax
import torch
from accelerate import init_empty_weights
from safetensors import safe_open

from ...interop import backend
from ...interop.sharding import CHECKPOINT_ATTR
from ..registry import DENOISERS


class CheckpointError(ValueError):
    """A checkpoint folder that does not match its model (named file, key, shape)."""


class SliceSource:
    """One weight in a safetensors file, placed by reading only the slices the local devices hold."""

    def __init__(self, path: str, key: str):
        self.path, self.key = path, key

    def read(self, index, dtype: torch.dtype):
        with safe_open(self.path, framework="pt") as handle:  # closed at once: no mapping of the file stays resident
            piece = handle.get_slice(self.key)[index] if index else handle.get_tensor(self.key)
        return backend.host_array(piece.to(dtype))

    def place(self, shape: tuple, dtype: torch.dtype, sharding) -> jax.Array:
        last = {}

        def read(index):
            bounds = tuple((s.start, s.stop, s.step) for s in index)
            if bounds not in last:  # replicated weights: every local device asks for the same slice
                last.clear()
                last[bounds] = self.read(index, dtype)
            return last[bounds]

        return jax.make_array_from_callback(shape, sharding, read)


def _read_whole(path: str, key: str) -> torch.Tensor:
    with safe_open(path, framework="pt") as handle:
        return handle.get_tensor(key)


def _weight_files(folder: str) -> tuple[list[str], dict[str, str]]:
    """The safetensors files of a model folder (sharded with an index, or one file) and the index's weight -> file
    map (empty without an index); clear errors otherwise."""
    index = [f for f in os.listdir(folder) if f.endswith(".safetensors.index.json")]
    if index:
        path = os.path.join(folder, sorted(index)[0])
        try:
            with open(path) as handle:
                weight_map = dict(json.load(handle)["weight_map"])
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise CheckpointError(f"{path} is not a readable safetensors index ({error}).") from None
        names = sorted(set(weight_map.values()))
        missing = [n for n in names if not os.path.exists(os.path.join(folder, n))]
        if missing:
            raise CheckpointError(
                f"{path} names {missing}, absent from {folder}: the download is incomplete; fetch those files again."
            )
        return [os.path.join(folder, n) for n in names], {k: os.path.join(folder, v) for k, v in weight_map.items()}
    files = sorted(f for f in os.listdir(folder) if f.endswith(".safetensors"))
    if not files:
        raise CheckpointError(
            f"{folder} has no .safetensors weights (diffusers_tpu loads safetensors only; convert "
            "a .bin checkpoint with save_pretrained(safe_serialization=True))."
        )
    return [os.path.join(folder, f) for f in files], {}


def _checkpoint(folder: str) -> tuple[dict[str, tuple[str, tuple, str]], dict[str, str]]:
    """key -> (file, shape, dtype) from the files' headers (nothing else is read), and the index's key -> file."""
    found = {}
    files, weight_map = _weight_files(folder)
    for path in files:
        try:
            with safe_open(path, framework="pt") as handle:
                for key in handle.keys():
                    piece = handle.get_slice(key)
                    found[key] = (path, tuple(piece.get_shape()), piece.get_dtype())
        except Exception as error:  # safetensors raises its own error types for a damaged header
            raise CheckpointError(f"{path} is not a readable safetensors file ({error}); fetch it again.") from None
    return found, weight_map


def _missing(name: str, files: list[str], weight_map: dict[str, str]) -> str:
    """Where a weight should have been: the file the index maps it to (its header lacks the name: damaged, or
    from another checkpoint), or the single weights file."""
    if name in weight_map:
        return (
            f"{name} is missing from {os.path.basename(weight_map[name])} (the index maps it there: that file's "
            "header is damaged or from another checkpoint; fetch it again)"
        )
    where = os.path.basename(files[0]) if len(files) == 1 else "every weights file"
    return f"{name} is missing from {where}"


def _keep_fp32(name: str, modules) -> bool:
    return any(m in name.split(".") for m in modules or ())


def empty_model(model_class, folder: str, torch_dtype: torch.dtype | None):
    """The model with meta parameters (buffers computed as usual), each tied to its place in the checkpoint."""
    found, weight_map = _checkpoint(folder)
    files = sorted({path for path, _, _ in found.values()} | set(weight_map.values())) or _weight_files(folder)[0]
    with init_empty_weights():
        model = model_class.from_config(model_class.load_config(folder))
    sources, problems = {}, []
    for name, parameter in model.named_parameters():
        if name not in found:
            problems.append(_missing(name, files, weight_map))
            continue
        path, shape, stored = found[name]
        if shape != tuple(parameter.shape):
            problems.append(
                f"{name} has shape {list(shape)} in {os.path.basename(path)}, the model expects {list(parameter.shape)}"
            )
        elif parameter.is_floating_point() != (stored[0] in "FB"):  # F16/F32/F64/BF16 vs integer/bool
            problems.append(f"{name} is {stored} in {os.path.basename(path)}, the model expects {parameter.dtype}")
        sources[name] = SliceSource(path, name)
    if problems:  # a name the model lacks, in some file, is likely the damaged one (alone, stock ignores it too)
        expected = {name for name, _ in model.named_parameters()} | {name for name, _ in model.named_buffers()}
        problems += [
            f"{os.path.basename(path)} holds {name!r}, a name {model_class.__name__} does not have"
            for name, (path, _, _) in sorted(found.items())
            if name not in expected
        ]
    if problems:
        raise CheckpointError(
            f"{folder} does not match {model_class.__name__}'s config: "
            + "; ".join(problems[:5])
            + (f" (and {len(problems) - 5} more)" if len(problems) > 5 else "")
        )
    with torch.no_grad():  # persistent buffers stored in the checkpoint (small) load whole, as stock does
        for name, buffer in model.named_buffers():
            if name in found:
                buffer.copy_(_read_whole(found[name][0], name).to(buffer.dtype))
    keep = getattr(model_class, "_keep_in_fp32_modules", None)
    for name, parameter in model.named_parameters():
        if parameter.is_floating_point():
            target = torch.float32 if torch_dtype is None or _keep_fp32(name, keep) else torch_dtype
            parameter.data = parameter.data.to(target)
    setattr(model, CHECKPOINT_ATTR, sources)
    return model.eval()


def from_pretrained(
    path: str,
    device: str = "tpu",
    config=None,
    dtype: torch.dtype | None = None,
    pipeline_class=None,
    torch_dtype: torch.dtype | None = None,
    **kwargs,
):
    """``pipeline_class.from_pretrained(path, ...)`` already moved to ``device`` with ``config``: the denoisers'
    weights read straight into their device shards (see the module docstring); other components load as stock.
    ``path``: a local pipeline folder (``model_index.json``). ``pipeline_class``: default the folder's class.
    ``dtype``: as diffusers' ``from_pretrained(dtype=...)``; ``torch_dtype``, its older name, is taken too."""
    if dtype is not None and torch_dtype is not None:
        raise ValueError("from_pretrained: pass dtype= or torch_dtype= (its older name), not both.")
    torch_dtype = dtype if dtype is not None else torch_dtype

    if backend.parse_device(device) is None:
        raise ValueError(
            f"from_pretrained(device={device!r}): sharded loading places weights on JAX devices; use "
            "device='tpu' or 'jax' (for a torch device, call the pipeline's own from_pretrained)."
        )
    index_path = os.path.join(path, "model_index.json")
    if not os.path.isfile(index_path):
        raise CheckpointError(
            f"{path} has no model_index.json: pass a local diffusers pipeline folder (one written "
            "by save_pretrained, or a downloaded snapshot)."
        )
    with open(index_path) as handle:
        index = json.load(handle)
    cls = pipeline_class or getattr(diffusers, index["_class_name"])
    models = {}
    for name in DENOISERS:
        entry = index.get(name)
        if name in kwargs or not isinstance(entry, list) or entry[1] is None:
            continue
        model_class = getattr(diffusers, entry[1], None)
        if model_class is None:
            raise CheckpointError(f"{index_path}: {name} is a {entry[1]}, which diffusers does not provide.")
        models[name] = empty_model(model_class, os.path.join(path, name), torch_dtype)
    if torch_dtype is not None:
        kwargs["dtype"] = torch_dtype  # diffusers 0.42's name: its older torch_dtype= warns (FutureWarning)
    pipe = cls.from_pretrained(path, **models, **kwargs)
    return pipe.to(device, config=config)
