"""The patches of torch itself (``torch_compat``): torchax importable on torch 2.13, whoever imports it first."""

import subprocess
import sys

import pytest
import torch

from diffusers_tpu.interop import import_hooks, patching, torch_compat
from tests.conftest import run_fresh


@pytest.mark.parametrize("first", ["", "import torch", "import torch, diffusers"])
def test_torchax_imports_after_the_package_whatever_was_imported_before(first):
    """A user's ``import torchax`` (and its default environment, which loads ``torchax.decompositions``) works after
    ``import diffusers_tpu``, with or without torch loaded first; on torch 2.13 only through the tolerance."""
    found = run_fresh(f"""
        import json
        {first}
        import diffusers_tpu
        import torchax
        env = torchax.default_env()
        import torch
        from diffusers_tpu.interop import patching
        print(json.dumps(dict(env=env is not None, shim="torchax-named-overloads" in patching.applied(),
                              named=hasattr(torch.ops.aten.prod, "dim_Dimname"))))
    """)
    assert found["env"] and found["shim"] == (not found["named"])


def test_torchax_does_not_import_on_torch_2_13_without_the_tolerance():
    """The reason for the patch, re-measured: without ``diffusers_tpu``, torchax fails on a torch without the
    named-tensor overloads (the day torchax stops naming them, this test says the patch can go)."""
    if torch_compat._torch_has_named_overloads():
        pytest.skip("this torch still has named-tensor overloads: the tolerance is a no-op")
    result = subprocess.run(
        [sys.executable, "-c", "import torchax; torchax.default_env()"],
        capture_output=True,
        text=True,
        cwd="/",
        timeout=300,
    )
    assert result.returncode != 0 and "Dimname" in result.stderr


def test_placeholders_only_inside_the_tolerance():
    packet = torch.ops.aten.prod
    if torch_compat._torch_has_named_overloads():
        pytest.skip("this torch still has named-tensor overloads: the tolerance is a no-op")
    with pytest.raises(AttributeError):
        packet.dim_Dimname
    with torch_compat.removed_named_overloads_tolerated():
        assert isinstance(packet.dim_Dimname, torch_compat._RemovedOverload)
        with pytest.raises(AttributeError):
            packet.not_an_overload  # other missing names still fail
        assert packet.dim_int is torch.ops.aten.prod.dim_int
    with pytest.raises(AttributeError):
        packet.dim_Dimname
    assert "torchax-named-overloads" in patching.applied()


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
