"""A tiny Wan on stock torch and with ``pipe.to("tpu")``, in a process where another backend may have named torch's
private device before ``import diffusers_tpu``; prints one JSON line.

    python tests/workers/shared_device_worker.py torchtpu    # TorchTPU's own device set-up (torch-tpu installed)
    python tests/workers/shared_device_worker.py tpu|npu     # the rename alone, as a backend's set-up does it
    python tests/workers/shared_device_worker.py none        # no other backend (an installed wheel's parity check)

``torchtpu`` runs what TorchTPU's autoload runs on a TPU VM (``_loader._init_device("tpu")``: lazy, no runtime starts
here); the others rename the device as any backend does. Then a tiny Wan runs on stock torch and on JAX with
``pipe.to("tpu")`` (``DIFFUSERS_TPU_PLATFORM=cpu``), and what TorchTPU owns is read before and after ``deactivate()``.
"""

import json
import os
import sys
import types

os.environ.setdefault("DIFFUSERS_TPU_PLATFORM", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

mode = sys.argv[1]
if mode == "torchtpu":
    from torch_tpu import _loader

    _loader._init_device("tpu")
elif mode != "none":  # a backend's set-up without chips: the rename, and a device module that has no devices
    torch.utils.rename_privateuse1_backend(mode)
    backend_module = types.ModuleType(f"torch.{mode}")
    backend_module.is_available, backend_module.device_count = (lambda: False), (lambda: 0)
    torch._register_device_module(mode, backend_module)
# what TorchTPU replaces or owns in torch (its device's generator): kept as it is, during and after
OWNED = ("compile", "set_float32_matmul_precision", "Generator")
owned = {name: getattr(torch, name) for name in OWNED}
found = {"mode": mode}
try:
    import diffusers_tpu
except ImportError as error:
    found["refused"] = f"{type(error).__name__}: {error}"
    print(json.dumps(found))
    raise SystemExit(0)

from diffusers_tpu.testing import tiny  # noqa: E402

found["imported_from"] = diffusers_tpu.__file__

pipe = tiny.wan_pipeline()
stock = pipe(**tiny.WAN_CALL, generator=torch.Generator().manual_seed(0)).frames
if mode != "none":  # what pipe.to(torch.device("tpu")) asks for: the JAX path too
    from diffusers_tpu.interop import backend

    found["torch_device_target"] = backend.parse_device(torch.device("tpu"))
pipe.to("tpu")
found["pipe_device"] = str(pipe.device)
ours = pipe(**tiny.WAN_CALL, generator=torch.Generator().manual_seed(0)).frames
found["max_abs"] = float(np.abs(np.asarray(ours) - np.asarray(stock)).max())
found["unchanged_while_active"] = [name for name in OWNED if getattr(torch, name) is owned[name]]
if mode == "torchtpu":
    found["torchtpu_runtime_started"] = bool(torch.tpu.is_initialized())
pipe.to("cpu")
diffusers_tpu.deactivate()
found["device_after_deactivate"] = str(torch.device({"torchtpu": "tpu", "none": "cpu"}.get(mode, mode)))
found["unchanged_after_deactivate"] = [name for name in OWNED if getattr(torch, name) is owned[name]]
print(json.dumps(found))
