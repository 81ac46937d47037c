"""``python -m diffusers_tpu.quantize_error``, the path README gives: the command lives in
``commands.quantize_error``."""

from .commands.quantize_error import main

if __name__ == "__main__":
    raise SystemExit(main())
