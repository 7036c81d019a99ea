# fgpu's binaries, built once for every image: `fgpu` (agent, CLI, CDI hook) and the shim
# libfgpu.so. Built on Debian 11 (glibc 2.31) so that they run on every base image below
# (Ubuntu 22.04 has glibc 2.35, Ubuntu 24.04 2.39). The eBPF object is prebuilt in the
# repository (fgpu-ebpf/out/fgpu.bpf.o), so no clang is needed here.
#
#   docker build -f deploy/images/build.Dockerfile -t fgpu-build .
ARG RUST_IMAGE=rust:1.95-bullseye
FROM ${RUST_IMAGE} AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p fgpu-agent -p fgpu-shim \
 && install -D -m 0755 target/release/fgpu /out/usr/bin/fgpu \
 && install -D -m 0644 target/release/libfgpu.so /out/usr/local/lib/fgpu/libfgpu.so
