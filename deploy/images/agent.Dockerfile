# The fgpu node agent, run privileged with the host's PID and cgroup namespaces:
#
#   docker run -d --name fgpu-agent --privileged --pid=host --cgroupns=host --network=none \
#     -v /sys/fs/bpf:/sys/fs/bpf -v /sys/kernel/tracing:/sys/kernel/tracing \
#     -v /sys/fs/cgroup:/sys/fs/cgroup -v /run/fgpu:/run/fgpu -v /run/fgpu-admin:/run/fgpu-admin \
#     -v /var/lib/fgpu:/var/lib/fgpu -v /usr/local/nvidia:/usr/local/nvidia:ro \
#     fgpu-agent:latest
#
# (On a hybrid cgroup host mount /sys/fs/cgroup/unified instead of /sys/fs/cgroup.) The
# driver's libcuda is found through the processes that map it (/proc/PID/root/...) and in the
# mounted driver directory. docs/containers.md explains every option.
ARG BUILD_IMAGE=fgpu-build
ARG BASE_IMAGE=ubuntu:24.04
# hadolint ignore=DL3006
FROM ${BUILD_IMAGE} AS build

FROM ${BASE_IMAGE}
# /usr/bin/fgpu, the shim, and fgpu's shell completions and man pages (under /usr/share).
COPY --from=build /out/ /
# The host's fgpu CLI and the CDI hook reach the admin socket; the agent serves callers in the
# namespaces of host PID 1 (--host-process 1), having checked that it shares the host's PID,
# cgroup and user namespaces.
ENTRYPOINT ["/usr/bin/fgpu", "agent", "--host-process", "1"]
