# A CUDA base image with fgpu's shim: every process in it is limited by fgpu. Under an agent
# the limit is the agent's for the container (from the CDI hook, or `fgpu limit set`), which
# the image's FGPU_MEMORY_LIMIT can only lower; without an agent the shim enforces
# FGPU_MEMORY_LIMIT on its own (standalone, with a warning).
#
#   docker build -f deploy/images/workload.Dockerfile \
#     --build-arg CUDA_IMAGE=nvidia/cuda:12.8.1-runtime-ubuntu24.04 \
#     --build-arg FGPU_MEMORY_LIMIT=8GiB -t fgpu-cuda:12.8-ubuntu24.04-8gb .
#
# deploy/images/build.sh builds the whole set (CUDA 12.x and 13.x, Ubuntu 22.04 and 24.04).
ARG BUILD_IMAGE=fgpu-build
ARG CUDA_IMAGE=nvidia/cuda:12.8.1-runtime-ubuntu24.04
# hadolint ignore=DL3006
FROM ${BUILD_IMAGE} AS build

# hadolint ignore=DL3006
FROM ${CUDA_IMAGE}
# The default memory limit of containers from this image, e.g. 8GiB ("" for none: the
# agent's or the CDI hook's only).
ARG FGPU_MEMORY_LIMIT=""
COPY --from=build /out/usr/local/lib/fgpu/libfgpu.so /usr/local/lib/fgpu/libfgpu.so
# /etc/ld.so.preload rather than LD_PRELOAD: also loaded into processes started with a
# cleared environment. The CDI spec mounts the node's libfgpu.so over this path, so that a
# container always runs the shim that matches its node's agent.
RUN echo /usr/local/lib/fgpu/libfgpu.so > /etc/ld.so.preload
ENV FGPU_MEMORY_LIMIT=${FGPU_MEMORY_LIMIT}
LABEL io.fgpu.memory-limit=${FGPU_MEMORY_LIMIT}
