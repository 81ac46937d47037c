"""Tiny offline models for tests, notebooks and ``--model tiny:*``: random weights, tokenizers built locally.

Like ``torch.testing``, this layer is outside the runtime's import graph: nothing in the product imports it but the
command line (``commands``) and the tests. ``tiny`` holds the Wan, CogVideoX, HunyuanVideo-1.5 and causal-Wan
pipelines; ``tiny_families`` the newer video families, ``tiny_images`` the image families, ``tiny_generic`` the
pipelines that take the generic path.

May import every layer below ``demo`` and ``commands``.
"""
