"""Command-line entries: ``diffusers-tpu`` (``cli``) and its argument helpers.

``cli`` dispatches ``generate``, the staged ``encode``/``denoise``/``decode``, ``bench``, ``profile``, ``plan``,
``cost``, ``ready`` and ``compile``; ``arguments`` holds the flags they share and builds the ``--model`` pipelines.
Benchmark scripts that are not subcommands live in the repository's ``benchmarks/`` (not in the wheel).

The top layer: may import every other layer, ``testing`` and ``demo`` included; nothing imports it.
"""
