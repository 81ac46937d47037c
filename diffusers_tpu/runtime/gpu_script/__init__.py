"""Calls a GPU script makes that mean something else on JAX: offloading, casting, ignored knobs."""
