"""Every code name the user-facing docs cite resolves in the tree: backticked dotted names (``runtime.cfg.CFGBatching``,
``TPUConfig.attention``, ``jax.monitoring``) and file names (``interop/jit.py``). A module renamed or a function
removed fails here with the doc and the stale name, so README, docs/ and BENCHMARKS.md cannot drift from the code."""

from __future__ import annotations

import ast
import dataclasses
import glob
import importlib
import os
import pkgutil
import re
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = ["README.md", "BENCHMARKS.md", *sorted(os.path.relpath(p, ROOT) for p in glob.glob(f"{ROOT}/docs/*.md"))]
DOTTED = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+")
FILE = re.compile(r"[\w./-]*\w\.(py|md|json|cfg|sh|png|ipynb)")
# Common short names of libraries in the docs' snippets.
ALIASES = {
    "jnp": "jax.numpy",
    "lax": "jax.lax",
    "pl": "jax.experimental.pallas",
    "np": "numpy",
    "splash": "jax.experimental.pallas.ops.tpu.splash_attention.splash_attention_kernel",
    "WanAttnProcessor": "diffusers.models.transformers.transformer_wan.WanAttnProcessor",
}
# Names the docs use for objects a user holds, resolved on the class they are.
HELD = {
    "pipe.vae": "diffusers.AutoencoderKLWan",
    "pipe": "diffusers.DiffusionPipeline",
    "vae": "diffusers.AutoencoderKLWan",
    "transformer": "diffusers.ModelMixin",
    "model": "diffusers.ModelMixin",
    "text_encoder": "transformers.PreTrainedModel",
    "scheduler": "diffusers.FlowMatchEulerDiscreteScheduler",
    "video_processor": "diffusers.video_processor.VideoProcessor",
    "compiled": "jax.stages.Compiled",
    "lowered": "jax.stages.Lowered",
}
# Named in the docs but not code of anyone's: what a command writes, files of a checkpoint, a kernel setting.
NOT_CODE = {
    "video.mp4": "the generate command's output",
    "video.wav": "the generate command's audio output",
    "model_index.json": "a diffusers checkpoint's file",
    "generation_config.json": "a transformers checkpoint's file",
    "vm.max_map_count": "a Linux sysctl",
}
# Attributes diffusers_tpu adds to a stock pipeline on `pipe.to("tpu")` (not on the class).
ADDED_TO_PIPE = {"block_timings"}


def _project_modules() -> list[str]:
    import diffusers_tpu

    names = ["diffusers_tpu"]
    for info in pkgutil.walk_packages(diffusers_tpu.__path__, "diffusers_tpu."):
        names.append(info.name)
    return names


def _attribute(owner, rest: list[str]) -> bool:
    for name in rest:
        fields = {f.name for f in dataclasses.fields(owner)} if dataclasses.is_dataclass(owner) else set()
        if name in fields and name == rest[-1]:
            return True
        if not hasattr(owner, name):
            return name in getattr(owner, "__annotations__", {}) and name == rest[-1]
        owner = getattr(owner, name)
    return True


def _resolve_dotted(name: str, modules: list[str]) -> bool:
    parts = name.split(".")
    for held, cls in HELD.items():  # the longest held name first (dict order)
        if name.startswith(held + "."):
            module, _, attr = cls.rpartition(".")
            tail = name[len(held) + 1 :].split(".")
            return tail[0] in ADDED_TO_PIPE or _attribute(getattr(importlib.import_module(module), attr), tail)
    head = ALIASES.get(parts[0], parts[0])
    candidates = [head.split(".") + parts[1:]]
    # A project module by its path inside the package (`runtime.cfg.X`, `jit.X`, `kernels.rotary`).
    for length in range(len(parts), 0, -1):
        suffix = ".".join(parts[:length])
        candidates += [m.split(".") + parts[length:] for m in modules if m.endswith("." + suffix)]
    for dotted in candidates:
        for split in range(len(dotted), 0, -1):
            try:
                owner = importlib.import_module(".".join(dotted[:split]))
            except ImportError:
                continue
            if _attribute(owner, dotted[split:]):
                return True
            break
    # A class or function of the project or of diffusers, by its own name (`TPUConfig.attention`, `BlockSizes.fit`,
    # `MultiAdapter.save_pretrained`).
    for module in [*modules, "diffusers"]:
        owner = getattr(importlib.import_module(module), parts[0], None)
        if owner is not None and _attribute(owner, parts[1:]):
            return True
    return False


def _files() -> list[str]:
    listed = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True).stdout.split()
    return listed or [os.path.relpath(p, ROOT) for p in glob.glob(f"{ROOT}/**/*", recursive=True)]


def _diffusers_test_folders() -> tuple[str, ...]:
    source = open(os.path.join(ROOT, "benchmarks", "diffusers_conformance.py"), encoding="utf-8").read()
    tree = ast.parse(source)
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "FAMILIES":
            return ast.literal_eval(node.value)
    raise AssertionError("benchmarks/diffusers_conformance.py lost FAMILIES")


def _resolve_file(name: str, files: list[str], doc: str) -> bool:
    name = name.removeprefix("./")
    if any(f == name or f.endswith("/" + name) for f in files):
        return True
    # docs/conformance.md names diffusers' own test files (tests/pipelines/<folder>/test_*.py of a diffusers checkout)
    folder, _, file = name.rpartition("/")
    return (
        doc == "docs/conformance.md"
        and file.startswith("test_")
        and (
            folder in _diffusers_test_folders()
            or (not folder and file.removeprefix("test_").removesuffix(".py") in _diffusers_test_folders())
        )
    )


def code_names() -> list[tuple[str, str]]:
    found = []
    for doc in DOCS:
        text = open(os.path.join(ROOT, doc), encoding="utf-8").read()
        text = re.sub(r"```.*?```", "", text, flags=re.S)  # code blocks are commands and snippets, run elsewhere
        for match in re.finditer(r"`([^`\n]+)`", text):
            token = match.group(1).removesuffix("()")
            if FILE.fullmatch(token) or DOTTED.fullmatch(token):
                found.append((doc, token))
    return sorted(set(found))


def unresolved(names: list[tuple[str, str]]) -> list[str]:
    modules, files = _project_modules(), _files()
    stale = []
    for doc, token in names:
        if token in NOT_CODE:
            continue
        ok = _resolve_file(token, files, doc) if FILE.fullmatch(token) else _resolve_dotted(token, modules)
        if not ok:
            stale.append(f"{doc}: `{token}`")
    return stale


def test_every_code_name_in_the_docs_resolves():
    names = code_names()
    assert len(names) > 150  # the scan sees the docs
    assert unresolved(names) == []


@pytest.mark.parametrize(
    "token",
    [
        "runtime.attach._run_on_host",
        "compile.compiled_memory",
        "interop/compile.py",
        "TPUConfig.no_such_field",
        "jax.nope",
    ],
)
def test_a_stale_name_is_caught(token):
    assert unresolved([("README.md", token)]) == [f"README.md: `{token}`"]


def test_the_user_facing_docs_cite_no_issue_numbers():
    """A reader cannot see the tracker: a doc says what changed and why, not which issue asked."""
    cited = [
        f"{doc}: {match.group(0)!r}"
        for doc in [*DOCS, "CHANGELOG.md"]
        for match in re.finditer(r"\bissues? #?\d+", open(os.path.join(ROOT, doc), encoding="utf-8").read(), re.I)
    ]
    assert cited == []


def test_the_changelog_is_release_notes():
    """What changed for a user, per release (≤ 300 lines for 0.1.0); the history of how is in git."""
    text = open(os.path.join(ROOT, "CHANGELOG.md"), encoding="utf-8").read()
    releases = re.split(r"^## ", text, flags=re.M)[1:]
    assert releases and releases[0].startswith("0.1.0")
    assert all(release.count("\n") <= 300 for release in releases)
