#!/usr/bin/env bash
# The lent GPU's standing list, as one prepared run (device tool: `run` with carry [".whl"], timeout_s 600).
#
# Prepare here first (the device has no registry):
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_17_x86_64 -d .whl diffusers==0.42.1 torchax==0.0.13 transformers==5.24.0 ftfy==6.3.1 \
#     wcwidth==0.9.4 importlib_metadata
#   .venv/bin/pip wheel --no-deps --no-build-isolation -w .whl .      # this project, kernels/ included
# then: bash benchmarks/gpu_session.sh   (on the device)
#
# What it records (each part under its own limit, its report in $OUT): Wan2.1-1.3B 480x832x81 bf16 one denoising
# step, stock torch eager and torch.compile beside the JAX program (diffusers-tpu profile: the rotary fix's effect),
# then the whole pipeline with the host text encoder (diffusers-tpu bench: peak device memory after each stage, the
# unexplained 40 GiB). Measured 2026-11-27: building --arch Wan2.1-1.3B took 92 s before the pooled random weights
# (now ~25 s on 2 cores); a part that builds the model needs >= 60 s beside its own work.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
# imageio-ffmpeg (~30 MB) is imported for mp4 output only: a stub keeps the carry small
mkdir -p /tmp/site/imageio_ffmpeg && touch /tmp/site/imageio_ffmpeg/__init__.py
export PYTHONPATH=/tmp/site
DT=/tmp/site/bin/diffusers-tpu
cd /tmp || exit 3
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/env.txt"
python3 -c "import jax, torch, diffusers, torchax; print(jax.__version__, jax.devices(), torch.__version__, diffusers.__version__, torchax.__version__)" 2>&1 | tail -1 | tee -a "$OUT/env.txt"
SIZE="--arch Wan2.1-1.3B --height 480 --width 832 --frames 81 --dtype bfloat16"
part() { # name, limit, command...
    local name=$1 limit=$2; shift 2
    echo "=== $name $(date +%T)"
    timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
    echo "exit $? $(date +%T)"
    tr '\r' '\n' < "$OUT/$name.log" | grep -v -E '%\||USDT' | tail -25
}
part profile_torch 240 $DT profile $SIZE --vs torch --torch-compile --torch-only --runs 3 --json "$OUT/profile_torch.json"
XLA_PYTHON_CLIENT_PREALLOCATE=false part profile_jax 150 $DT profile $SIZE --runs 3 --json "$OUT/profile_jax.json"
part bench_host 180 $DT bench $SIZE --steps 4 --text-encoder host --vs torch --runs 2 --warmup 1 --json "$OUT/bench_host.json"
