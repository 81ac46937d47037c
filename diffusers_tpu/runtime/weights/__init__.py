"""Weights as the devices hold them: stacked, quantized, in host memory, loaded by slices, LoRA."""
