"""``diffusers-tpu``: generate a video with a stock diffusers pipeline on TPU (or any JAX platform)."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import warnings

TINY_DEFAULTS = dict(frames=9, height=64, width=64, steps=4)


def _mesh(text: str) -> dict[str, int]:
    try:
        sizes = [int(part) for part in text.split(",")]
    except ValueError:
        sizes = []
    if len(sizes) != 3 or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"--mesh takes three positive sizes dp,sp,tp (e.g. 2,1,4), got {text!r}")
    return dict(zip(("dp", "sp", "tp"), sizes))


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="diffusers-tpu", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    gen = commands.add_parser("generate", help="text-to-video with a diffusers pipeline on JAX")
    gen.add_argument("--model", help="local diffusers folder (default: the built-in tiny random-weight Wan model)")
    gen.add_argument("--prompt", default="A cat walks on the grass, realistic")
    gen.add_argument("--negative-prompt", default="blurry, low quality, static")
    gen.add_argument("--frames", type=int, help="frames (Wan: 4k+1); default: the pipeline's (tiny model: 9)")
    gen.add_argument("--height", type=int, help="default: the pipeline's (tiny model: 64)")
    gen.add_argument("--width", type=int, help="default: the pipeline's (tiny model: 64)")
    gen.add_argument("--steps", type=int, help="denoising steps; default: the pipeline's (tiny model: 4)")
    gen.add_argument("--guidance", type=float, default=5.0, help="classifier-free guidance scale")
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument("--platform", default="auto", choices=("auto", "tpu", "jax", "cpu", "gpu"),
                     help="auto: tpu when JAX sees one, else JAX's default platform; cpu/gpu rehearse the TPU path")
    gen.add_argument("--mesh", type=_mesh, help="device mesh dp,sp,tp (product = device count); default: automatic")
    gen.add_argument("--attention", choices=("splash", "xla"), help="attention kernel (default: per platform)")
    gen.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32", help="denoiser weight dtype")
    gen.add_argument("--fps", type=int, default=16)
    gen.add_argument("--output", default="video.mp4", help="mp4 path (written atomically)")
    return parser


def _device(platform: str) -> str:
    if platform in ("cpu", "gpu"):
        os.environ["DIFFUSERS_TPU_PLATFORM"] = platform
        return "tpu"
    if platform == "auto":
        import jax

        return "tpu" if any(d.platform == "tpu" for d in jax.devices()) else "jax"
    return platform


def _load(args):
    import torch

    if args.model is None:
        from . import tiny

        for name, value in TINY_DEFAULTS.items():
            if getattr(args, name) is None:
                setattr(args, name, value)
        return tiny.wan_pipeline("wan", seed=0)
    import diffusers

    return diffusers.DiffusionPipeline.from_pretrained(args.model, use_safetensors=True, torch_dtype=torch.float32)


def write_video_atomically(frames, path: str, fps: int) -> None:
    """Write frames with diffusers' ``export_to_video`` to a temp file beside ``path``, then rename it."""
    from diffusers.utils import export_to_video

    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    handle, temp = tempfile.mkstemp(suffix=".mp4", prefix=".partial-", dir=directory)
    os.close(handle)
    try:
        with warnings.catch_warnings():
            # imageio starts ffmpeg with fork+exec; JAX's at-fork hook warns about forking, needlessly here.
            warnings.filterwarnings("ignore", message="os.fork", category=RuntimeWarning)
            export_to_video(frames, temp, fps=fps)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(temp, 0o666 & ~umask)  # mkstemp creates 0600; the video gets the user's usual mode
        os.replace(temp, path)
    except BaseException:
        if os.path.exists(temp):
            os.remove(temp)
        raise


def generate(args) -> int:
    import torch

    import diffusers_tpu

    device = _device(args.platform)  # fail fast on a bad platform, before loading weights
    dtype = torch.bfloat16 if args.dtype == "bfloat16" else None
    config = diffusers_tpu.TPUConfig(mesh=args.mesh, attention=args.attention, dtype=dtype)
    start = time.perf_counter()
    pipe = _load(args)
    pipe.to(device, config=config)
    print(f"loaded and placed in {time.perf_counter() - start:.1f} s: {type(pipe).__name__} on {device}", flush=True)
    call = dict(prompt=args.prompt, negative_prompt=args.negative_prompt, guidance_scale=args.guidance,
                generator=torch.Generator().manual_seed(args.seed), output_type="pil")
    for key, name in (("num_frames", "frames"), ("height", "height"), ("width", "width"),
                      ("num_inference_steps", "steps")):
        if getattr(args, name) is not None:
            call[key] = getattr(args, name)
    frames = pipe(**call).frames[0]
    stats = diffusers_tpu.stats(pipe)
    write_video_atomically(frames, args.output, args.fps)
    print(f"{stats.summary()}", flush=True)
    print(f"wrote {len(frames)} frames ({frames[0].width}x{frames[0].height}) to {args.output}", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return generate(args)
    except (ValueError, RuntimeError) as error:
        print(f"diffusers-tpu: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
