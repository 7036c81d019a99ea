#!/usr/bin/env bash
# Builds fgpu's images: the agent, and CUDA workload bases with and without a default memory
# limit (tags like the fractional-GPU images they replace: fgpu-cuda:12.8-ubuntu24.04-8gb).
#   deploy/images/build.sh [REGISTRY/]   (run from anywhere; needs docker or podman)
set -euo pipefail
cd "$(dirname "$0")/../.."
prefix=${1:-}
engine=${ENGINE:-$(command -v docker || command -v podman)}
# CUDA base images (Docker Hub nvidia/cuda): 12.x and 13.x on Ubuntu 22.04 and 24.04.
cudas=(12.8.1 13.0.1)
ubuntus=(22.04 24.04)
limits=("" 8 16 24 40)

"$engine" build -f deploy/images/build.Dockerfile -t fgpu-build .
"$engine" build -f deploy/images/agent.Dockerfile -t "${prefix}fgpu-agent:latest" .
for cuda in "${cudas[@]}"; do
  for ubuntu in "${ubuntus[@]}"; do
    base="nvidia/cuda:${cuda}-runtime-ubuntu${ubuntu}"
    short="${cuda%.*}"
    for gb in "${limits[@]}"; do
      tag="${prefix}fgpu-cuda:${short}-ubuntu${ubuntu}${gb:+-${gb}gb}"
      "$engine" build -f deploy/images/workload.Dockerfile \
        --build-arg CUDA_IMAGE="$base" \
        --build-arg FGPU_MEMORY_LIMIT="${gb:+${gb}GiB}" -t "$tag" .
    done
  done
done
