"""The pipeline runtime: a stock diffusers pipeline attached to JAX by ``pipe.to("tpu")``, run, and detached.

Holds the user's knobs (``config.TPUConfig``), the family contract and registry (``registry``), attaching and
detaching a pipeline (``pipeline_runtime``; what it changed on the user's objects and how to put each back:
``overrides``),
the compiled denoiser entry (``denoiser``), attention on the mesh (``attention``), batched classifier-free guidance
(``cfg``), on-device postprocessing (``postprocess``), scheduler fixes (``schedulers``), GPU-script semantics
(``gpu_script_calls``), stock code kept on the host (``stock_on_host``), calls too large refused first
(``oversized_calls``), LoRA (``lora``), weight quantization (``quantize``), sharded loading (``loading``), staged
runs (``stages``) and the patches of diffusers/peft/torch (``patches``).

May import: ``interop`` and ``kernels``. Never ``families`` (they register themselves into ``registry``), the
planner, ``testing``, ``demo`` or ``commands``.
"""
