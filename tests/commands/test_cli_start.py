"""The command line's first seconds: ``--help`` and argument mistakes answered before torch, JAX or diffusers load
(counted as imports, not timed), each mistake named with its fix, and the fix accepted when done as said."""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from diffusers_tpu.commands import arguments, model_names, parser, pipeline_call, subcommand_arguments

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HEAVY = ("torch", "jax", "diffusers", "transformers", "torchax")


def _cli(*argv: str) -> dict:
    """The command in a fresh interpreter: exit status, stderr, and which heavy packages it imported."""
    code = textwrap.dedent(f"""
        import contextlib, io, json, sys
        from diffusers_tpu.commands import cli
        err, out = io.StringIO(), io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            try:
                status = cli.main({list(argv)!r})
            except SystemExit as stop:
                status = stop.code
        heavy = sorted(m for m in {HEAVY!r} if m in sys.modules)
        print(json.dumps(dict(status=status, stderr=err.getvalue(), stdout=out.getvalue(), heavy=heavy)))
    """)
    env = {k: v for k, v in os.environ.items() if not k.startswith("DIFFUSERS_TPU_")}
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        cwd="/",
        env={**env, "PYTHONPATH": ROOT},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    "command", [None, "generate", "bench", "profile", "plan", "cost", "encode", "denoise", "decode"]
)
def test_help_loads_nothing_heavy(command):
    found = _cli(*([command] if command else []), "--help")
    assert found["status"] == 0 and "usage: diffusers-tpu" in found["stdout"]
    assert found["heavy"] == []


MISTAKES = [  # (argv, words the message must hold, a corrected argv taken from the message's own advice)
    (["generate", "--steps", "-3"], ["--steps", "at least 1"], ["generate", "--steps", "1"]),
    (["generate", "--height", "70"], ["--height 70", "multiple of 16", "use 64 or 80"], ["generate", "--height", "64"]),
    (["generate", "--frames", "13"], ["--frames 13", "use 9 or 19"], ["generate", "--frames", "19"]),
    (
        ["generate", "--model", "tiny:ltx", "--width", "48"],
        ["multiple of 32", "use 32 or 64"],
        ["generate", "--model", "tiny:ltx", "--width", "64"],
    ),
    (
        ["generate", "--model", "tiny:wan", "--frames", "8"],
        ["--frames 8", "use 5 or 9"],
        ["generate", "--model", "tiny:wan", "--frames", "9"],
    ),
    (["generate", "--model", "tiny:nope"], ["no such tiny model", "tiny:wan"], ["generate", "--model", "tiny:wan"]),
    (
        ["generate", "--model", "./Wan2.1-T2V-1.3B-Diffusers"],
        ["no such folder", "hf download", "--model demo"],
        ["generate", "--model", "demo"],
    ),
    (["generate", "--model", "Wan-AI/Wan2.1-T2V-1.3B-Diffusers"], ["looks like a Hub id", "--local-dir"], None),
    (
        ["generate", "--model", "tiny:flux", "--output", "x.mp4"],
        ["makes images", "image.png"],
        ["generate", "--model", "tiny:flux", "--output", "image.png"],
    ),
    (["generate", "--output", "/proc/nope/video.mp4"], ["--output /proc/nope/video.mp4", "writable"], None),
    (["plan", "--arch", "Wan3", "--chips", "v6e-4"], ["--arch Wan3", "Wan2.1-14B"], None),
    (["bench", "--runs", "0"], ["--runs", "at least 1"], None),
    (["generate", "--mesh", "2,2"], ["--mesh", "dp,sp,tp"], None),
    (
        ["plan", "--arch", "Wan2.1-1.3B"],
        ["plan needs a target", "--chips"],
        ["plan", "--arch", "Wan2.1-1.3B", "--chips", "v5e-1"],
    ),
    (["cost", "--chips", "v6e-4"], ["exactly one of --arch"], ["cost", "--chips", "v6e-4", "--arch", "Wan2.1-1.3B"]),
    (
        ["decode", "--stage-dir", "/no/such/run"],
        ["no encode stage", "diffusers-tpu encode --stage-dir /no/such/run"],
        None,
    ),
]


@pytest.mark.parametrize("argv,words,fixed", MISTAKES, ids=[" ".join(m[0]) for m in MISTAKES])
def test_mistakes_are_named_before_heavy_imports_and_the_fix_is_accepted(argv, words, fixed, tmp_path):
    found = _cli(*argv)
    assert found["status"] == 2 and found["heavy"] == [], found
    for word in words:
        assert word in found["stderr"], (word, found["stderr"])
    if fixed is not None:  # doing what the message says passes every check made before loading
        output = [] if "--output" in fixed or fixed[0] != "generate" else ["--output", str(tmp_path / "v.mp4")]
        args = subcommand_arguments.build().parse_args(fixed + output)
        parser.check(args)


def test_a_folder_without_model_index_and_a_folder_class_rule(tmp_path):
    with pytest.raises(ValueError, match="no model_index.json"):
        model_names.check_model(str(tmp_path))
    (tmp_path / "model_index.json").write_text(json.dumps({"_class_name": "LTXPipeline"}))
    model_names.check_model(str(tmp_path))
    args = subcommand_arguments.build().parse_args(
        ["generate", "--model", str(tmp_path), "--height", "48", "--output", str(tmp_path / "v.mp4")]
    )
    with pytest.raises(ValueError, match="multiple of 32"):
        parser.check(args)


def test_demo_prompt_outside_its_grammar_warns_once_naming_the_words():
    assert parser.demo_prompt_warning("a yellow square moves left") is None
    warning = parser.demo_prompt_warning("an orange triangle moves diagonally")
    assert warning.count("\n") == 0 and "'orange'" in warning and "'triangle'" in warning and "circle" in warning


def test_the_parsers_lists_match_what_the_package_builds():
    from diffusers_tpu.planner import architectures

    assert sorted(model_names.TINY_MODELS) == sorted(arguments.tiny_models())
    assert sorted(model_names.ARCHITECTURES) == sorted(architectures.ARCHITECTURES)
    assert set(model_names.BUILT_IN_RULES) == {
        model_names.DEMO_MODEL,
        *model_names.ARCHITECTURES,
        *(model_names.TINY_PREFIX + name for name in model_names.TINY_MODELS),
    }


def _made(pipe, model, **size) -> tuple:
    """(height, width, frames) of what the stock pipeline (torch CPU, two steps) makes for ``size``; None if it refuses
    (its own check, or a shape error in the model)."""
    call = {
        **getattr(pipe, "_diffusers_tpu_tiny_call", {}),
        "prompt": "a cat",
        "negative_prompt": "low",
        "num_inference_steps": 2,
        "output_type": "np",
        "max_sequence_length": arguments.sequence_length(pipe, model),
        **size,
    }
    call = {name: value for name, value in call.items() if value is not None}
    try:
        output = pipe(**pipeline_call.call_arguments(pipe, call), generator=torch.Generator().manual_seed(0))
    except (ValueError, RuntimeError):
        return None
    if hasattr(output, "images"):
        return tuple(np.asarray(output.images[0]).shape[:2]) + (None,)
    video = np.asarray(output.frames[0])
    return video.shape[1], video.shape[2], video.shape[0]


@pytest.mark.parametrize("model", sorted(set(model_names.BUILT_IN_RULES) - set(model_names.ARCHITECTURES)))
def test_built_in_size_rules_are_what_the_stock_pipeline_does(model):
    """The rule's sizes come out as asked; half a multiple off (and a frame count off the rule) is refused or changed
    by the stock pipeline itself, so refusing it before loading takes nothing away."""
    rule = model_names.BUILT_IN_RULES[model]
    pipe = arguments.load_pipeline(model)
    height, width = 2 * rule.multiple, 3 * rule.multiple
    frames = {} if rule.every is None else {"num_frames": rule.first + rule.every}
    made = _made(pipe, model, height=height, width=width, **frames)
    assert made is not None and made[:2] == (height, width), made
    if rule.every is not None:
        assert made[2] == rule.first + rule.every
        off = _made(pipe, model, height=height, width=width, num_frames=rule.first + rule.every + 1)
        assert off is None or off[2] != rule.first + rule.every + 1
    if rule.multiple > 1:
        off = _made(pipe, model, height=height + rule.multiple // 2, width=width, **frames)
        assert off is None or off[0] != height + rule.multiple // 2


def _warnings_in(stderr: str) -> list[str]:
    """stderr lines that are not progress bars: what a user would read as a message."""
    lines = [line for chunk in stderr.splitlines() for line in chunk.split("\r")]
    return [line for line in lines if line.strip() and not ("it/s]" in line or "s/it]" in line or "%|" in line)]


def test_readme_snippet_prints_no_warning(tmp_path):
    """README's first snippet's shape (a stock pipeline loaded, moved, called, exported) prints nothing on stderr but
    progress bars (README's first command:
    ``test_cli.test_readme_frame_strip_is_what_the_documented_command_writes``)."""
    snippet = textwrap.dedent("""
        import torch, diffusers
        import diffusers_tpu
        from diffusers_tpu import demo

        pipe = diffusers.WanPipeline.from_pretrained(demo.MODEL_DIR, dtype=torch.float32)
        pipe.to("jax")
        video = pipe("a red square moves left", **demo.CALL, generator=torch.Generator().manual_seed(0)).frames[0]
        diffusers.utils.export_to_video(video, "cat.mp4", fps=16)
        pipe.to("cpu")
    """)
    result = subprocess.run([sys.executable, "-c", snippet], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert _warnings_in(result.stderr) == [] and (tmp_path / "cat.mp4").stat().st_size > 0
