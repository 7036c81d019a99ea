"""Applies fgpu's generated CDI spec by hand, for tests/gpu/containers.sh (no container
runtime on the GPU machine): what a runtime does with the spec's edits, minus the mount
namespace.

  env SPEC                 print the spec's env edits, one KEY=VALUE a line, with container
                           paths that the spec bind-mounts replaced by their host paths
  hook SPEC STATE_JSON     run the spec's createRuntime hook exactly as the spec says (path,
                           args), with the OCI state on stdin; exit with its status
"""
import json
import subprocess
import sys


def load(path):
    with open(path) as f:
        spec = json.load(f)
    return spec, spec.get("containerEdits", {})


def host_path(edits, value):
    # The longest mount whose container path prefixes the value wins (as in a mount table).
    best = None
    for m in edits.get("mounts", []):
        c = m["containerPath"]
        if value == c or value.startswith(c.rstrip("/") + "/"):
            if best is None or len(c) > len(best["containerPath"]):
                best = m
    return value if best is None else best["hostPath"] + value[len(best["containerPath"]):]


def main():
    cmd, spec_path = sys.argv[1], sys.argv[2]
    spec, edits = load(spec_path)
    if cmd == "env":
        for e in edits.get("env", []):
            key, _, value = e.partition("=")
            print(key + "=" + host_path(edits, value))
    elif cmd == "hook":
        hooks = [h for h in edits.get("hooks", []) if h["hookName"] == "createRuntime"]
        if len(hooks) != 1:
            sys.exit("the spec has %d createRuntime hooks, expected 1" % len(hooks))
        h = hooks[0]
        rc = subprocess.run(
            h["args"], executable=h["path"], input=sys.argv[3].encode(),
            timeout=h.get("timeout", 15),
        ).returncode
        sys.exit(rc)
    else:
        sys.exit("unknown command " + cmd)


if __name__ == "__main__":
    main()
