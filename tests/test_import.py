"""``import diffusers_tpu`` stays cheap: what only some paths need loads when they need it (``import_hooks``).

Each case runs in a fresh interpreter: what a process has imported is the thing under test. Imports are counted,
not timed, so the tests hold on a busy machine (the timings are in README)."""

import sys

from diffusers_tpu.interop import import_hooks
from tests.conftest import run_fresh


def test_import_without_torch_loads_nothing_heavy_and_switches_on_with_diffusers_pipelines():
    found = run_fresh("""
        import json, sys
        import diffusers_tpu
        before = sorted(m for m in ("torch", "jax", "diffusers", "torchax") if m in sys.modules)
        from diffusers import WanPipeline  # diffusers' pipeline module loads: the integration switches on
        import torch
        from diffusers_tpu.interop import patching
        print(json.dumps(dict(before=before, to="DiffusionPipeline.to" in patching.labels(WanPipeline.to),
                              generator=type(torch.Generator("tpu")).__name__)))
    """)
    assert found == dict(before=[], to=True, generator="Generator")


def test_import_after_torch_and_diffusers_defers_the_model_classes_and_families():
    found = run_fresh("""
        import json, sys
        import torch, diffusers
        import diffusers_tpu
        loaded = lambda *names: sorted(n for n in names if n in sys.modules)
        before = loaded("diffusers.pipelines.pipeline_utils", "diffusers.models.transformers", "peft",
                        "diffusers_tpu.families.wan")
        patched_generator = type(torch.Generator("tpu")).__name__
        from diffusers import DiffusionPipeline
        from diffusers_tpu.interop import patching
        to = "DiffusionPipeline.to" in patching.labels(DiffusionPipeline.to)
        status = diffusers_tpu.supported_pipelines()["WanPipeline"]
        print(json.dumps(dict(before=before, generator=patched_generator, to=to, status=status,
                              after=loaded("diffusers_tpu.families.wan"))))
    """)
    assert found == dict(
        before=[], generator="Generator", to=True, status="verified", after=["diffusers_tpu.families.wan"]
    )


def test_when_imported_runs_after_the_body_or_at_once(tmp_path, monkeypatch):
    (tmp_path / "hooked_module_for_test.py").write_text("VALUE = 41\nVALUE += 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []
    import_hooks.when_imported("hooked_module_for_test", lambda module: seen.append(module.VALUE))
    assert seen == []
    import hooked_module_for_test  # noqa: F401

    assert seen == [42]
    import_hooks.when_imported("hooked_module_for_test", lambda module: seen.append(-module.VALUE))
    assert seen == [42, -42]
    sys.modules.pop("hooked_module_for_test")
