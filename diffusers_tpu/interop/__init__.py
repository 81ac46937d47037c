"""The torch <-> JAX layer: model-agnostic, the floor every other layer stands on.

Holds what any torch module needs to run on JAX through torchax and nothing about diffusers pipelines: the
patches of torch and torchax (``compat/``), multi-host start-up (``distributed``), device strings, the
torchax environment and the mesh (``backend``), weight placement (``sharding``), compiled module methods
(``jit``) and what crosses back to the user's torch code (``user_tensors``).

May import: the standard library, torch, torchax, JAX, and ``diffusers_tpu.kernels``. Never a layer above it
(runtime, families, planner, testing, demo, commands): the layers above give it their rules through its hooks
(``sharding.register_adapter_naming``, ``weights.Rebuilt``) instead.
"""
