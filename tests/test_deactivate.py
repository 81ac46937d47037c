"""``diffusers_tpu.deactivate()``: every patch undone, every pipeline back on the host, and stock code then gives bit
for bit what a process that never imported ``diffusers_tpu`` gives."""

import json

import numpy as np
import pytest

from tests.conftest import run_fresh

# How an attribute is named across processes: its owner (a module or class) by import path, the value it holds in the
# owner's own namespace by its defining module and qualified name
DESCRIBE = """
import importlib, types
ABSENT = object()
def owner_path(owner):
    if isinstance(owner, types.ModuleType):
        return [owner.__name__, ""]
    if isinstance(owner, type):
        return [owner.__module__, owner.__qualname__]
    return None
def describe(owner, name):
    value = vars(owner).get(name, ABSENT)
    if value is ABSENT:
        return "absent"
    inner = getattr(value, "__func__", value)
    qualname = getattr(inner, "__qualname__", None)
    if isinstance(qualname, str):
        return f"{{getattr(inner, '__module__', None)}}.{{qualname}}"
    return f"{{type(value).__module__}}.{{type(value).__qualname__}}"
"""

STOCK_ATTRIBUTES = (
    DESCRIBE
    + """
import json, functools
import diffusers, torch
found = []
for module, qualname, name in json.loads({touched!r}):
    try:
        owner = functools.reduce(getattr, qualname.split(".") if qualname else [], importlib.import_module(module))
    except Exception:  # torchax and the package's own modules: not importable without diffusers_tpu
        found.append(None)
        continue
    found.append(describe(owner, name))
print(json.dumps({{"found": found}}))
"""
)

STOCK = """
import json, sys, numpy as np, torch
from diffusers import WanPipeline
pipe = WanPipeline.from_pretrained({folder!r})
frames = pipe("a cat walks", num_inference_steps=2, height=32, width=32, num_frames=5, output_type="np",
              generator=torch.Generator().manual_seed(0)).frames
np.save({out!r}, np.asarray(frames))
print(json.dumps({{"diffusers_tpu": "diffusers_tpu" in sys.modules}}))
"""

DEACTIVATED = (
    DESCRIBE
    + """
import json, numpy as np, torch
import torch.nn.functional as F
from diffusers import DiffusionPipeline, WanPipeline
before = {{name: getattr(torch.accelerator, name) for name in torch.accelerator.__all__}}
stock_generator, stock_to, stock_call = torch.Generator, DiffusionPipeline.to, WanPipeline.__call__
import diffusers_tpu, torchax  # torchax imports on torch 2.13 only through diffusers_tpu
from diffusers_tpu.interop import patching
from diffusers_tpu.runtime.attention import sdpa
call = dict(prompt="a cat walks", num_inference_steps=2, height=32, width=32, num_frames=5, output_type="np")
pipe = WanPipeline.from_pretrained({folder!r})
pipe.to("jax")
on_jax = np.asarray(pipe(**call, generator=torch.Generator().manual_seed(0)).frames)
changed = sorted(patching.applied())
diffusers_tpu.deactivate()
kept = np.asarray(pipe(**call, generator=torch.Generator().manual_seed(0)).frames)  # the pipeline moved back
fresh = WanPipeline.from_pretrained({folder!r})
np.save({out!r}, np.asarray(fresh(**call, generator=torch.Generator().manual_seed(0)).frames))
report = {{
    "changed": changed,
    "left": patching.applied(),
    "accelerator": all(getattr(torch.accelerator, n) is f for n, f in before.items()),
    "generator": torch.Generator is stock_generator,
    "to": DiffusionPipeline.to is stock_to and WanPipeline.__call__ is stock_call,
    "sdpa": torchax.default_env()._ops[F.scaled_dot_product_attention].func is not sdpa.scaled_dot_product_attention,
    "on_jax_vs_kept": float(np.abs(on_jax - kept).max()),
    "kept_vs_fresh": float(np.abs(kept - np.load({out!r})).max()),
    "labels": patching.labels(DiffusionPipeline.to),
    "touched": [
        [*path, name, describe(owner, name)]
        for owner, name in patching.touched()
        if (path := owner_path(owner)) is not None
    ],
}}
try:
    torch.Generator("tpu")
    report["tpu_generator"] = True
except RuntimeError:
    report["tpu_generator"] = False
diffusers_tpu.activate()  # on again: the patches are back and a move works as before
pipe.to("jax")
again = np.asarray(pipe(**call, generator=torch.Generator().manual_seed(0)).frames)
report["again_vs_on_jax"] = float(np.abs(again - on_jax).max())
# (torchax's import ran once, inside torch_itself's tolerance: that label names the import, not a lasting patch)
report["reapplied"] = sorted(set(changed) - set(patching.applied()) - {{"torchax-removed-aten-names"}})
pipe.to("cpu")
print(json.dumps(report))
"""
)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny_wan")
    run_fresh(
        f"""
        import json
        from diffusers_tpu.testing import tiny
        tiny.save_wan_pipeline({str(path)!r})
        print(json.dumps({{}}))
        """
    )
    return str(path)


@pytest.mark.slow
def test_a_deactivated_process_runs_stock_code_as_a_stock_process(folder, tmp_path):
    stock = run_fresh(STOCK.format(folder=folder, out=str(tmp_path / "stock.npy")))
    assert stock["diffusers_tpu"] is False  # the reference never imported it
    report = run_fresh(DEACTIVATED.format(folder=folder, out=str(tmp_path / "deactivated.npy")))
    assert "DiffusionPipeline.to" in report["changed"] and "torch.accelerator" in report["changed"]
    assert report["left"] == [] and report["labels"] == []
    assert report["accelerator"] and report["generator"] and report["to"] and report["sdpa"]
    assert report["tpu_generator"] is False  # torch.Generator("tpu") is refused again, as stock torch refuses it
    # the pipeline that was on JAX, back on the host: its weights are equal to a fresh one's, in new memory. torch's CPU
    # matmuls depend on the weights' alignment (from_pretrained's are mmap'd, 8-byte aligned): stock diffusers alone,
    # its transformer's weights cloned, moves this tiny Wan's frames by the same 1.04e-6
    assert report["kept_vs_fresh"] <= 1e-4
    assert report["on_jax_vs_kept"] <= 1e-4
    np.testing.assert_array_equal(np.load(tmp_path / "deactivated.npy"), np.load(tmp_path / "stock.npy"))
    assert report["reapplied"] == [] and report["again_vs_on_jax"] == 0.0  # every patch back, the same video
    # every attribute a patch set holds what a process that never imported diffusers_tpu holds there
    touched = [row[:3] for row in report["touched"]]
    stock_values = run_fresh(STOCK_ATTRIBUTES.format(touched=json.dumps(touched)))["found"]
    compared = [(row, there) for row, there in zip(report["touched"], stock_values) if there is not None]
    differ = [
        f"{m}:{q}.{n} is {here}, in a stock process {there}" for (m, q, n, here), there in compared if here != there
    ]
    assert differ == []
    names = {f"{m}:{q}.{n}" for (m, q, n, _), _ in compared}
    assert {
        "diffusers.hooks:.apply_group_offloading",
        "diffusers.pipelines.pipeline_utils:DiffusionPipeline.to",
    } <= names
    assert len(compared) >= 20, names
