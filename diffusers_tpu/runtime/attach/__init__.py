"""Attaching a pipeline: ``pipe.to("tpu")`` places, shards and wraps it; ``pipe.to("cpu")`` undoes it."""
