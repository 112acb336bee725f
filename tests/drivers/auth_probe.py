"""Connect to each of a cluster's listeners without the token; print what each answered.

``python auth_probe.py '[[name, host, port, kind, what], ...]'`` where kind is ``grpc``
(``what``: a method the server implements, called with an empty request) or ``http``
(``what``: a path). Prints one JSON object: name -> ``refused`` (the server demanded the
token: gRPC UNAUTHENTICATED, HTTP 401/403), ``open`` (it answered without one),
``unreachable``, or ``other:<detail>``. Run by the security test as another Unix user.
"""

from __future__ import annotations

import json
import sys
import urllib.error
import urllib.request


def grpc_probe(host: str, port: int, method: str) -> str:
    import grpc

    with grpc.insecure_channel(f"{host}:{port}") as channel:
        call = channel.unary_unary(method)
        try:
            call(b"", timeout=10)
        except grpc.RpcError as e:
            code = e.code()
            if code == grpc.StatusCode.UNAUTHENTICATED:
                return "refused"
            if code == grpc.StatusCode.UNAVAILABLE:
                return "unreachable"
            return f"other:{code.name}:{e.details()}"
        return "open"


def http_probe(host: str, port: int, path: str) -> str:
    try:
        with urllib.request.urlopen(f"http://{host}:{port}{path}", timeout=10) as r:
            return "open" if r.status < 400 else f"other:{r.status}"
    except urllib.error.HTTPError as e:
        return "refused" if e.code in (401, 403) else f"other:{e.code}"
    except (urllib.error.URLError, OSError) as e:
        return f"unreachable:{e}"


def main() -> None:
    out = {}
    for name, host, port, kind, what in json.loads(sys.argv[1]):
        out[name] = grpc_probe(host, port, what) if kind == "grpc" else http_probe(host, port, what)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
