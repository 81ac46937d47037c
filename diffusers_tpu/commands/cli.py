"""``diffusers-tpu``: run a command (its arguments and their checks: ``parser``; usage: ``diffusers-tpu --help``)."""

from __future__ import annotations

import os
import sys
import time

from ..interop import interrupts
from . import parser as arguments_parser
from . import subcommand_arguments
from .arguments import device_for, fill_defaults, load_pipeline, makes_images, sequence_length
from .model_names import DEFAULT_MODEL
from .parser import IMAGE_SUFFIXES
from .pipeline_call import call_arguments

STARTED = time.perf_counter()  # this module loads as the command starts (the package's import is light)


def say(message: str) -> None:
    """Progress for the user: from process 0 only in a multi-host run (every host runs the same command)."""
    from ..interop import processes

    if processes.is_main_process():
        print(message, flush=True)


_written: list[str] = []  # outputs this command wrote (an interrupted run says which)


def _main_process_writes(write, *args) -> None:
    """Outputs are written whole and verified (``runtime.outputs``); in a multi-host run only process 0 writes
    (every process holds the same result)."""
    from ..interop import processes

    interrupts.raise_if_dropped()  # a Ctrl-C Python dropped (``interrupts``) stops the run before anything is written
    if processes.is_main_process():
        write(*args)
    _written.append(args[1])


def write_audio(audio, path: str, rate: int) -> None:
    """``audio``: float [channels, samples] in [-1, 1] -> 16-bit PCM WAV."""
    import numpy as np

    from ..runtime.files import outputs

    audio = np.asarray(audio, dtype=np.float32)
    if audio.ndim != 2 or audio.shape[0] < 1:
        raise ValueError(f"audio must be [channels, samples] with at least one channel, got shape {audio.shape}.")
    pcm = (np.clip(audio, -1.0, 1.0) * 32767).round().astype("<i2")
    _main_process_writes(outputs.write_wav, np.ascontiguousarray(pcm.T), path, rate)


def _prepare(args, model: str):
    """Fill the model's defaults, load, and place the pipeline (bad platforms fail before loading weights)."""
    import torch

    import diffusers_tpu

    device = device_for(args.platform)
    fill_defaults(args, model)
    config = None
    if device != "torch":
        dtype = torch.bfloat16 if args.dtype == "bfloat16" else None
        config = diffusers_tpu.TPUConfig(
            mesh=args.mesh,
            attention=args.attention,
            dtype=dtype,
            text_encoder=args.text_encoder,
            matmul_precision=args.matmul_precision,
            quantize=args.quantize,
        )
    start = time.perf_counter()
    pipe = load_pipeline(model)
    if args.command == "generate":
        _check_output(pipe, args)  # before any weight moves
    elif args.command == "decode" and args.output is None:
        args.output = "video.mp4"
    if device == "torch":
        pipe.to("cpu")
    else:
        pipe.to(device, config=config)
    say(f"loaded {model} and placed it in {time.perf_counter() - start:.1f} s: {type(pipe).__name__} on {device}")
    return pipe


def _report(pipe) -> None:
    from ..runtime.attach import moves, pipeline_runtime

    if pipeline_runtime.is_attached(pipe) and moves.stats(pipe).total_seconds > 0:  # a pipeline call ran
        say(moves.stats(pipe).summary())


def _write(frames, args) -> None:
    """``frames``: uint8 [frames, height, width, 3] (or PIL images)."""
    import numpy as np
    import PIL.Image

    from ..runtime.files import outputs

    images = [PIL.Image.fromarray(f) for f in frames] if isinstance(frames, np.ndarray) else frames
    _main_process_writes(outputs.write_video, images, args.output, args.fps)
    say(f"wrote {len(images)} frames ({images[0].width}x{images[0].height}) to {args.output}")
    if getattr(args, "strip", None):
        strip = PIL.Image.fromarray(np.concatenate([np.asarray(image.convert("RGB")) for image in images], axis=1))
        _main_process_writes(outputs.write_image, strip, args.strip)
        say(f"wrote the {len(images)} frames side by side ({strip.width}x{strip.height}) to {args.strip}")


def _size_call(args) -> dict:
    return dict(height=args.height, width=args.width, num_frames=args.frames, num_inference_steps=args.steps)


def generate(args) -> int:
    import torch

    from ..runtime.files import stages

    model = args.model or DEFAULT_MODEL
    pipe = _prepare(args, model)
    sequence = sequence_length(pipe, model)
    if args.stage_dir:
        frames = stages.generate(
            pipe,
            args.stage_dir,
            prompt=args.prompt,
            negative_prompt=args.negative_prompt,
            guidance_scale=args.guidance,
            max_sequence_length=sequence,
            seed=args.seed,
            model=model,
            stop_after=args.stop_after,
            force=args.force,
            **_size_call(args),
        )
        _report(pipe)
        if frames is None:
            say(
                f"stopped after {args.stop_after}; continue with: diffusers-tpu "
                f"{'denoise' if args.stop_after == 'encode' else 'decode'} --stage-dir {args.stage_dir}"
            )
            return 0
        _write(frames[0], args)
        return 0
    call = {k: v for k, v in _size_call(args).items() if v is not None}
    if args.blocks is not None:
        call["num_blocks"] = args.blocks
    if args.guidance is not None:
        call["guidance_scale"] = args.guidance
    if sequence is not None:
        call["max_sequence_length"] = sequence
    call.update(prompt=args.prompt, negative_prompt=args.negative_prompt, output_type="pil")
    call = {**getattr(pipe, "_diffusers_tpu_tiny_call", {}), **call}
    output = pipe(**call_arguments(pipe, call), generator=torch.Generator().manual_seed(args.seed))
    _report(pipe)
    if makes_images(pipe):
        _write_image(output.images[0], args.output)
    else:
        _write(output.frames[0], args)
    if getattr(output, "audio", None) is not None:  # LTX-2's soundtrack, beside the video
        path = os.path.splitext(args.output)[0] + ".wav"
        write_audio(output.audio[0].float().cpu().numpy(), path, pipe.vocoder.config.output_sampling_rate)
        say(f"wrote {output.audio.shape[-1]} audio samples to {path}")
    return 0


def _check_output(pipe, args) -> None:
    """Default the output path by what the pipeline makes; refuse a mismatch before anything runs."""
    images = makes_images(pipe)
    if args.output is None:
        args.output = "image.png" if images else "video.mp4"
    is_image_path = args.output.lower().endswith(IMAGE_SUFFIXES)
    if images and getattr(args, "strip", None):
        raise ValueError(
            f"{type(pipe).__name__} makes images: --strip (a video's frames side by side) does not apply; drop it."
        )
    if images and not is_image_path:
        raise ValueError(
            f"{type(pipe).__name__} makes images: pass --output with an image suffix "
            f"({', '.join(IMAGE_SUFFIXES)}), e.g. --output image.png."
        )
    if not images and is_image_path:
        raise ValueError(f"{type(pipe).__name__} makes videos: pass --output ending in .mp4.")


def _write_image(image, path: str) -> None:
    from ..runtime.files import outputs

    _main_process_writes(outputs.write_image, image, path)
    say(f"wrote a {image.width}x{image.height} image to {path}")


def stage(args) -> int:
    from ..runtime.files import stages

    recorded = stages.StageDir(args.stage_dir).settings("encode")
    if args.command != "encode" and recorded is None:
        raise stages.StageError(arguments_parser.no_encode_stage(args.stage_dir))
    model = args.model or (recorded or {}).get("model") or DEFAULT_MODEL
    pipe = _prepare(args, model)
    start = time.perf_counter()
    if args.command == "encode":
        stages.encode(
            pipe,
            args.stage_dir,
            prompt=args.prompt,
            negative_prompt=args.negative_prompt,
            guidance_scale=args.guidance,
            max_sequence_length=sequence_length(pipe, model),
            model=model,
            force=args.force,
        )
    elif args.command == "denoise":
        stages.denoise(pipe, args.stage_dir, seed=args.seed, force=args.force, **_size_call(args))
    else:
        _write(stages.decode(pipe, args.stage_dir, force=args.force)[0], args)
    _report(pipe)
    say(f"{args.command} done in {time.perf_counter() - start:.2f} s ({args.stage_dir})")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = subcommand_arguments.build().parse_args(argv)
    try:
        with interrupts.watch():  # a Ctrl-C anywhere stops the run (``interrupts``: also one CPython would drop)
            return _run(args, argv)
    except KeyboardInterrupt:
        output = getattr(args, "output", None) if args.command in ("generate", "decode") else None
        written = f"; wrote {', '.join(_written)} before it" if _written else ""
        kept = (
            f"; {output} was not written (any previous file there is unchanged)"
            if output not in (None, *_written)
            else ""
        )
        print(f"\ndiffusers-tpu: interrupted{written}{kept}", file=sys.stderr)
        return 130  # the shell's code for a process ended by SIGINT


def _run(args, argv: list[str] | None) -> int:
    try:
        arguments_parser.check(args)  # the mistakes that can be named before torch, JAX and diffusers load
        if args.command == "cost":  # before JAX's first device query starts libtpu, which reads its flags only then
            from ..planner import kernel_work

            kernel_work.start_dump()
        import diffusers_tpu

        diffusers_tpu.activate()
        if args.command == "bench":
            from . import bench

            return bench.main(args)
        if args.command == "profile":
            from . import profile_step

            return profile_step.main(args)
        if args.command == "plan":
            from . import plan_command

            return plan_command.main(args, argv if argv is not None else sys.argv[1:])
        if args.command == "cost":
            from . import cost as cost_module

            return cost_module.main(args)
        if args.command == "ready":
            from . import ready

            return ready.main(args)
        if args.command == "compile":
            from . import compile_ahead

            return compile_ahead.main(args)
        status = generate(args) if args.command == "generate" else stage(args)
        say(
            f"done in {time.perf_counter() - STARTED:.1f} s, start to finish (imports, loading, compiling, running, "
            "writing)"
        )
        return status
    except (ValueError, RuntimeError) as error:
        print(f"diffusers-tpu: error: {error}", file=sys.stderr)
        return 2
    except OSError as error:  # an output could not be written (the old file is unchanged; nothing partial is left)
        from ..runtime.files.outputs import OutputError

        if not isinstance(error, OutputError):
            raise
        print(f"diffusers-tpu: error: {error}; any previous file there is unchanged", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
