"""The patches of diffusers' and peft's classes, in one room, at the runtime's top: ``entry_points`` (where the
project enters stock code: ``pipe.to("tpu")``, a moved pipeline's ``__call__``, ``torch.Generator("tpu")``, group
offloading onto JAX, and ``apply``, which applies every patch of the package), ``stock_classes`` (adapters, modular
pipelines, casting, FreeNoise...) and ``older_diffusers`` (diffusers 0.38-0.41 made to behave as 0.42 on JAX). Each is
a section headed by what it does, with its reason and guard, set through ``patching`` and undone by ``deactivate()``.
torch's and torchax's patches are ``interop/compat/``; nothing else in the package patches a third-party class for
good (``tests/test_layers.py``).
"""
