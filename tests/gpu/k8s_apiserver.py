"""A stand-in for the Kubernetes API server (tests/gpu/k8s_prepare.sh): serves the JSON
files under ROOT by path (GET /apis/... -> ROOT/apis/....json), answers PATCH (server-side
apply) with the body it got (and keeps it under ROOT/patched/), and a Status 404 otherwise.
Usage: python3 k8s_apiserver.py ROOT PORTFILE (writes the port it listens on to PORTFILE)."""
import http.server
import json
import os
import sys

ROOT = sys.argv[1]


class Handler(http.server.BaseHTTPRequestHandler):
    def _send(self, code, body):
        data = body.encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)

    def _path(self):
        p = os.path.normpath(self.path.split("?")[0]).lstrip("/")
        return None if p.startswith("..") else os.path.join(ROOT, p + ".json")

    def do_GET(self):
        p = self._path()
        if p and os.path.isfile(p):
            self._send(200, open(p).read())
        else:
            self._send(404, json.dumps({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                        "reason": "NotFound", "code": 404, "message": self.path}))

    def do_PATCH(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0))).decode()
        d = os.path.join(ROOT, "patched")
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, os.path.basename(self.path.split("?")[0]) + ".json"), "w") as f:
            f.write(body)
        self._send(200, body)

    def log_message(self, fmt, *args):
        sys.stderr.write("apiserver: " + (fmt % args) + "\n")


srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
with open(sys.argv[2], "w") as f:
    f.write(str(srv.server_address[1]))
srv.serve_forever()
