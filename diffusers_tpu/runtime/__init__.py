"""The pipeline runtime: a stock diffusers pipeline attached to JAX by ``pipe.to("tpu")``, run, and detached.

At the root, what every room reads: the user's knobs (``config.TPUConfig``), the family contract (``registry``),
what "supported" means (``support``), what ``pipe.to`` will do (``decision``, with ``text_encoder_placement``'s
rule) and the door to diffusers' private names (``diffusers_private``). The rooms:

    attach/      pipe.to("tpu"): place, shard, wrap; pipe.to("cpu") undoes it; the GPU-script calls a move
                 answers, the warm-up; ``moves`` is its door (``plan`` takes an unplaced runtime there)
    call/        what runs in a call: the denoiser's compiled entry, guidance as one batch, the step's glue
    attention/   torch's SDPA, diffusers' backends and processors routed to the kernels
    weights/     stacked, quantized, in host memory, loaded by slices, LoRA
    gpu_script/  offloading and casting on JAX
    programs/    how programs are built and stored ahead
    files/       outputs written atomically, staged runs
    patches/     every patch of diffusers' and peft's classes, ``pipe.to("tpu")``'s entry among them: the top room

The rooms are layered as the package is (``tests/test_layers.py``): no two import each other. docs/layout.md has every
module in one line and the two paths pictured. May import: ``interop`` and ``kernels``.
Never ``families`` (they register themselves into ``registry``), the planner, ``testing``, ``demo`` or ``commands``.
"""
