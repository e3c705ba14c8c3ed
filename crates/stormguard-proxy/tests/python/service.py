"""A plain Python service (standard library only, no stormguard code) behind the ingress proxy.

GET /hop/<path>: reads the deadline the ingress handed it (grpc-timeout), calls
http://<downstream>/<path> through the egress proxy (as its HTTP proxy) with the time it has
left, and answers with what it saw. It passes on the downstream's status and its
X-Retry-Exhausted mark, as a service that lets one layer retry does.

Prints its port on the first line of stdout, then serves until killed.
"""
import json
import sys
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

EGRESS = sys.argv[1]        # host:port of the egress proxy
DOWNSTREAM = sys.argv[2]    # host:port of the downstream service

UNITS = {"H": 3600.0, "M": 60.0, "S": 1.0, "m": 1e-3, "u": 1e-6, "n": 1e-9}


def grpc_timeout_seconds(value):
    if not value or value[-1] not in UNITS or not value[:-1].isdigit():
        return None
    return int(value[:-1]) * UNITS[value[-1]]


def encode_grpc_timeout(seconds):
    return "%dm" % max(1, int(seconds * 1000))


OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({"http": "http://" + EGRESS}))


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_GET(self):
        started = time.monotonic()
        given = grpc_timeout_seconds(self.headers.get("grpc-timeout"))
        path = self.path[len("/hop"):] if self.path.startswith("/hop") else self.path
        request = urllib.request.Request("http://%s%s" % (DOWNSTREAM, path))
        if given is not None:
            left = given - (time.monotonic() - started)
            request.add_header("grpc-timeout", encode_grpc_timeout(left))
        try:
            with OPENER.open(request, timeout=30) as response:
                status, exhausted = response.status, response.headers.get("x-retry-exhausted")
                response.read()
        except urllib.error.HTTPError as error:
            status, exhausted = error.code, error.headers.get("x-retry-exhausted")
        body = json.dumps({"given_ms": None if given is None else given * 1000.0,
                           "downstream_status": status}).encode()
        self.send_response(status)
        if exhausted:
            self.send_header("x-retry-exhausted", exhausted)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
print(server.server_address[1], flush=True)
server.serve_forever()
