"""The planner: what a call needs before anything runs — memory per device, step-time floors, TPU lowering.

``plan`` lowers the runtime's own programs on abstract sharded weights and reads XLA's memory analysis;
``architectures`` builds real-size pipelines on the ``meta`` device from published configs (with the offline
stand-in tokenizers of ``standins``); ``lowering`` exports a program for TPU with ``jax.export`` on any machine.

May import: ``interop``, ``runtime``, ``families``, ``kernels`` and the package's public API. Never ``testing``,
``demo`` or ``commands``.
"""
