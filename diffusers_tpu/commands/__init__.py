"""Command-line entries: ``diffusers-tpu`` (``cli``) and its argument helpers, benchmarks and measurement scripts.

``cli`` dispatches ``generate``, the staged ``encode``/``denoise``/``decode``, ``bench`` and ``plan``;
``arguments`` holds the flags they share and builds the ``--model`` pipelines; ``bench``, ``plan_command``,
``load_memory`` and ``quantize_error`` are one command each.

The top layer: may import every other layer, ``testing`` and ``demo`` included; nothing imports it.
"""
