"""The patches of torch and torchax, in one room: what torch's version in use and torchax's claim on torch's private
device need changed in torch (``torch_itself``), TorchTPU's device shared (``shared_device``), and torchax made to
behave as torch does (``torchax_tensors``, which applies them all and wraps torchax's dispatch once; views and indexing
in ``torchax_views``, the mesh in ``torchax_mesh``, op results in ``torchax_ops``). Each patch is a section headed by
what it does, with its reason and version guard, set through ``patching`` and undone by ``deactivate()``. diffusers'
and peft's patches are ``runtime/patches/``.

The package's own body imports nothing: ``startup``'s import hooks load ``torch_itself`` and ``shared_device`` while
torchax itself is loading, before torchax may be imported here.
"""
