"""The patches of torch itself (``torch_itself``): torchax importable on torch 2.13+, whoever imports it first."""

import subprocess
import sys

import pytest
import torch

from diffusers_tpu.interop import import_hooks, patching
from diffusers_tpu.interop.compat import torch_itself
from tests.conftest import run_fresh


def _names_removed() -> list[str]:
    """What this torch removed of the names torchax 0.0.13 uses (named-tensor overloads, ``REMOVED_OPS``)."""
    removed = [] if hasattr(torch.ops.aten.prod, "dim_Dimname") else ["dim_Dimname"]
    return removed + [op for op in torch_itself.REMOVED_OPS if not hasattr(torch.ops.aten, op)]


@pytest.mark.parametrize("first", ["", "import torch", "import torch, diffusers"])
def test_torchax_imports_after_the_package_whatever_was_imported_before(first):
    """A user's ``import torchax`` (and its default environment, which loads ``torchax.decompositions``) works after
    ``import diffusers_tpu``, with or without torch loaded first; on torch 2.13+ only through the tolerance."""
    found = run_fresh(f"""
        import json
        {first}
        import diffusers_tpu
        import torchax
        env = torchax.default_env()
        from diffusers_tpu.interop import patching
        print(json.dumps(dict(env=env is not None, shim="torchax-removed-aten-names" in patching.applied())))
    """)
    assert found["env"] and found["shim"]


def test_torchax_does_not_import_on_this_torch_without_the_tolerance():
    """The reason for the patch, re-measured: without ``diffusers_tpu``, torchax fails on a torch without the names
    it uses (the day torchax stops naming them, this test says the patch can go)."""
    removed = _names_removed()
    if not removed:
        pytest.skip("this torch still has every aten name torchax uses: the tolerance is a no-op")
    result = subprocess.run(
        [sys.executable, "-c", "import torchax; torchax.default_env()"],
        capture_output=True,
        text=True,
        cwd="/",
        timeout=300,
    )
    assert result.returncode != 0 and any(name.split("_")[-1] in result.stderr for name in removed), result.stderr


def test_placeholders_only_inside_the_tolerance():
    packet, removed = torch.ops.aten.prod, _names_removed()
    with torch_itself.removed_aten_names_tolerated():
        assert isinstance(packet.dim_Dimname, torch_itself._RemovedOverload) or "dim_Dimname" not in removed
        for op in torch_itself.REMOVED_OPS:
            found = getattr(torch.ops.aten, op)
            assert isinstance(found.default, torch_itself._RemovedOverload) == (op in removed)
        with pytest.raises(AttributeError):
            packet.not_an_overload  # other missing names still fail
        with pytest.raises(AttributeError):
            torch.ops.aten.not_an_op_of_torch
        assert packet.dim_int is torch.ops.aten.prod.dim_int
    for name in removed:
        with pytest.raises(AttributeError):
            getattr(packet, name) if name == "dim_Dimname" else getattr(torch.ops.aten, name)
    assert "torchax-removed-aten-names" in patching.applied()


def test_while_importing_runs_the_body_inside_the_context_once(tmp_path, monkeypatch):
    (tmp_path / "wrapped_module_for_test.py").write_text("import builtins\nINSIDE = builtins.inside_for_test\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import builtins
    import contextlib

    entered = []

    @contextlib.contextmanager
    def inside():
        entered.append(True)
        builtins.inside_for_test = True
        try:
            yield
        finally:
            del builtins.inside_for_test

    import_hooks.while_importing("wrapped_module_for_test", inside)
    import wrapped_module_for_test

    assert wrapped_module_for_test.INSIDE is True and entered == [True] and not hasattr(builtins, "inside_for_test")
    with pytest.raises(RuntimeError, match="imported already"):
        import_hooks.while_importing("wrapped_module_for_test", inside)
    sys.modules.pop("wrapped_module_for_test")
