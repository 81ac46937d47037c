"""The pipeline runtime: a stock diffusers pipeline attached to JAX by ``pipe.to("tpu")``, run, and detached.

At the root, what every room reads: the user's knobs (``config.TPUConfig``), the family contract (``registry``),
what "supported" means (``support``), what ``pipe.to`` will do (``decision``), where the project enters stock code
(``entry_points``) and the doors to diffusers' private names and older releases (``diffusers_private``,
``diffusers_compat``). The rooms:

    attach/      pipe.to("tpu"): place, shard, wrap; pipe.to("cpu") undoes it
    call/        what runs in a call: the denoiser's compiled entry, guidance as one batch, the step's glue
    attention/   torch's SDPA, diffusers' backends and processors routed to the kernels
    weights/     stacked, quantized, in host memory, loaded by slices, LoRA
    gpu_script/  offloading, casting and the other GPU-script calls on JAX
    programs/    how programs are built, stored ahead, warmed up
    files/       outputs written atomically, staged runs

docs/layout.md has every module in one line and the two paths pictured. May import: ``interop`` and ``kernels``.
Never ``families`` (they register themselves into ``registry``), the planner, ``testing``, ``demo`` or ``commands``.
"""
