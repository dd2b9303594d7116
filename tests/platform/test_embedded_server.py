"""The tests' own web servers: one whose port another process took between choosing it and
binding it starts again on another port, instead of failing the test that needs it."""

from __future__ import annotations

import json
import socket
import sys
import urllib.request

import embedded_server

# A web server that answers /healthz as the platform does, on the port it is given.
HEALTHZ = """
import http.server, json, sys
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"status": "ok"}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
"""


def test_a_taken_port_is_tried_again_on_another(tmp_path, monkeypatch):
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    ports = [taken.getsockname()[1]]
    real_free_port = embedded_server.free_port
    monkeypatch.setattr(embedded_server, "free_port",
                        lambda: ports.pop(0) if ports else real_free_port())

    def command(port: int) -> list[str]:
        return [sys.executable, "-c", HEALTHZ, str(port)]

    with taken, embedded_server.serve(command, {}, tmp_path / "server.log") as base:
        assert base != f"http://127.0.0.1:{taken.getsockname()[1]}"
        with urllib.request.urlopen(f"{base}/healthz", timeout=5) as answer:
            assert json.load(answer) == {"status": "ok"}
