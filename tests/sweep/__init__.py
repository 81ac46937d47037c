"""The parity sweep (``python -m tests.sweep.run``): every pipeline class with a tiny recipe against stock torch."""
