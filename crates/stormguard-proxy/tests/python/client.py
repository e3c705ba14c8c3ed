"""A plain Python client (standard library only, no stormguard code) in front of the egress
proxy, which it uses as its HTTP proxy.

usage: client.py EGRESS METHOD URL [HEADER=VALUE ...]
Prints one JSON line: the status, the headers (lowercase names) and the body.
"""
import json
import sys
import urllib.error
import urllib.request

egress, method, url = sys.argv[1:4]
headers = dict(arg.split("=", 1) for arg in sys.argv[4:])
opener = urllib.request.build_opener(urllib.request.ProxyHandler({"http": "http://" + egress}))
data = b'{"amount": 1}' if method == "POST" else None
request = urllib.request.Request(url, data=data, method=method, headers=headers)
try:
    with opener.open(request, timeout=30) as response:
        status, head, body = response.status, response.headers, response.read()
except urllib.error.HTTPError as error:
    status, head, body = error.code, error.headers, error.read()
print(json.dumps({
    "status": status,
    "headers": {k.lower(): v for k, v in head.items()},
    "body": body.decode("utf-8", "replace"),
}))
