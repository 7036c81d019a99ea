# Sourced by the GPU scripts: where the bundle's parts are, and the machine's defaults.
#   HERE     this folder (tests/gpu of the bundle)
#   B        the bundle (bin/fgpu, lib/libfgpu.so, tests/)
#   PY       the Python with PyTorch (PY=... overrides)
#   LIBCUDA  the driver library the agent probes (LIBCUDA=... overrides)
#   OUT      where results go (the device tool's $OUT)
# shellcheck shell=bash disable=SC2034
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
B=$(cd "$HERE/../.." && pwd)
FGPU=$B/bin/fgpu
SHIM=$B/lib/libfgpu.so
PY=${PY:-/opt/torch/.venv/bin/python3}
LIBCUDA=${LIBCUDA:-/usr/local/nvidia/lib64/libcuda.so.1}
OUT=${OUT:-/tmp/fgpu-out}
