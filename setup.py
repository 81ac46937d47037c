"""setup.cfg holds the project's metadata and dependencies; this file says what setup.cfg cannot: which packages.

Every package under ``diffusers_tpu/`` is found, not listed (a listed tree once left runtime's sub-packages out of the
wheel), and the top-level ``kernels/`` folder is installed as ``diffusers_tpu.kernels``: a top-level ``kernels`` import
name would collide with an existing PyPI package. ``tests/test_packaging.py`` builds the sdist and, from it, the wheel,
and checks that they hold the source tree.
"""

from setuptools import find_packages, setup

KERNELS = "diffusers_tpu.kernels"

setup(
    packages=[
        *find_packages(include=["diffusers_tpu", "diffusers_tpu.*"]),
        KERNELS,
        *(f"{KERNELS}.{name}" for name in find_packages("kernels")),
    ],
    package_dir={"diffusers_tpu": "diffusers_tpu", KERNELS: "kernels"},
)
