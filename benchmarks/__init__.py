"""Repository tooling, not in the wheel: benchmarks and comparisons run from a checkout
(``python benchmarks/<name>.py``)."""
