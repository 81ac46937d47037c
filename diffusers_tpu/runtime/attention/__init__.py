"""Attention on the mesh: torch's SDPA, diffusers' backends and processors routed to the kernels."""
