"""CPU per call of the extender's hand-written HTTP pieces against the libraries they stand in for.

Issue 12 item 4: keep a hand-written piece only where this shows the library cannot meet the extender's
targets. Two comparisons, each in one run, medians of --repeats rounds (rounds interleaved):

1. The bind's two writes (merge PATCH of the reservation + POST of the Binding) to the API stand-in
   (tests/support/kube_standin.py, plain HTTP on 127.0.0.1), CPU of the calling thread per bind, through
   - `generated`: the official client's CoreV1Api methods (as a caller of the kubernetes package writes them);
   - `urllib3`: the same requests straight on that client's urllib3 pool (no generated layer);
   - `podwriter`: scheduler_extender/kubeio/podwrites.PodWriter (its own keep-alive sockets, httptools parsing).
2. Serving one request, CPU of the server thread per request (a keep-alive client POSTs a typical filter
   body: ExtenderArgs with a 2 KiB pod and 100 node names; the handler reads and decodes it and answers a
   small JSON object), with
   - `stdlib`: http.server.BaseHTTPRequestHandler (send_response / send_header / end_headers / write);
   - `lean`: memslice.lean_http.LeanRequestHandler (its parse_request fast path, send_all);
   both with TCP_NODELAY, as the extender's handler sets it (the stdlib's default, Nagle on, costs it
   about three times the CPU per request here: its headers and body are two writes).

usage: python benchmarks/bench_http.py [--json] [--calls N] [--repeats N]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import orjson

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
__import__("testpaths").add()  # the test folders (tests/testpaths.py)

from kube_standin import KubeApiStandin  # noqa: E402

from memslice.lean_http import LeanRequestHandler  # noqa: E402
from memslice.scheduler_extender.kubeio.podwrites import MERGE_PATCH, PodWriter  # noqa: E402

NS = "bench"


def pod(name: str) -> dict[str, Any]:
    return {"kind": "Pod", "metadata": {"name": name, "namespace": NS, "labels": {"app": "bench"}},
            "spec": {"schedulerName": "memslice", "containers": [
                {"name": "main", "image": "registry.example/app:1",
                 "resources": {"limits": {"memslice.io/gpu-mem": "4"}}}]}}


def reservation(i: int) -> dict[str, Any]:
    return {"metadata": {"annotations": {"memslice.io/reservation": json.dumps(
        {"node": "n0", "gpu": f"GPU-n0-{i % 8}", "containers": {"main": 4}, "assumed-at": "2026-01-01T00:00:00Z"})}}}


def binding(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": name, "namespace": NS},
            "target": {"apiVersion": "v1", "kind": "Node", "name": "n0"}}


def bind_generated(core: Any) -> Callable[[str, int], None]:
    def write(name: str, i: int) -> None:
        core.patch_namespaced_pod(name, NS, reservation(i), _content_type=MERGE_PATCH)
        # the answer is a Status, which the generated V1Binding model cannot hold: read it undecoded
        core.create_namespaced_pod_binding(name, NS, binding(name), _preload_content=False).read()
    return write


def bind_urllib3(api: Any) -> Callable[[str, int], None]:
    pool, host = api.rest_client.pool_manager, api.configuration.host

    def write(name: str, i: int) -> None:
        path = f"{host}/api/v1/namespaces/{NS}/pods/{name}"
        for url, ctype, body in ((path, MERGE_PATCH, reservation(i)),
                                 (path + "/binding", "application/json", binding(name))):
            resp = pool.request("PATCH" if ctype == MERGE_PATCH else "POST", url, body=orjson.dumps(body),
                                headers={"Content-Type": ctype, "Accept": "application/json",
                                         "User-Agent": api.user_agent})
            if resp.status >= 300:
                raise RuntimeError(f"{url}: {resp.status}")
            orjson.loads(resp.data)
    return write


def bind_podwriter(writer: PodWriter) -> Callable[[str, int], None]:
    def write(name: str, i: int) -> None:
        writer.patch_namespaced_pod(name, NS, reservation(i))
        writer.create_namespaced_pod_binding(name, NS, binding(name))
    return write


def measure_binds(kube: KubeApiStandin, label: str, write: Callable[[str, int], None], calls: int) -> float:
    """Median µs of calling-thread CPU per bind (both writes); pods are created outside the timing."""
    names = [f"{label}-{kube.resource_version}-{i}" for i in range(calls)]
    for name in names:
        kube.put(pod(name))
    write(names[0], 0)  # connection set up outside the figures
    samples = []
    for i, name in enumerate(names[1:], 1):
        t0 = time.thread_time_ns()
        write(name, i)
        samples.append(time.thread_time_ns() - t0)
    for name in names:
        kube.delete("Pod", NS, name)
    return statistics.median(samples) / 1000


# ---------------------------------------------------------------------------------------------- serving

FILTER_BODY = orjson.dumps({"Pod": {**pod("p"), "metadata": {
    **pod("p")["metadata"], "uid": "0f9d1c3e-5b7a-4c2e-9f1d-2a3b4c5d6e7f", "resourceVersion": "123456",
    "annotations": {f"example.com/note-{i}": "x" * 40 for i in range(20)}}},
    "NodeNames": [f"node-{i:04d}" for i in range(100)]})
ANSWER = orjson.dumps({"NodeNames": [f"node-{i:04d}" for i in range(100)], "FailedNodes": {}, "Error": ""})


class StdlibHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # as the extender sets it: without, both pay delayed-ACK stalls
    cpu: list[int]

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        pass

    def handle_one_request(self) -> None:
        t0 = time.thread_time_ns()
        super().handle_one_request()
        self.cpu.append(time.thread_time_ns() - t0)

    def do_POST(self) -> None:  # noqa: N802 - stdlib naming
        orjson.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(ANSWER)))
        self.end_headers()
        self.wfile.write(ANSWER)


class LeanHandler(LeanRequestHandler):
    disable_nagle_algorithm = True
    cpu: list[int]

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        pass

    def handle_one_request(self) -> None:
        t0 = time.thread_time_ns()
        super().handle_one_request()
        self.cpu.append(time.thread_time_ns() - t0)

    def do_POST(self) -> None:  # noqa: N802 - stdlib naming
        orjson.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
        self.send_all(200, ANSWER, "application/json")


def measure_serving(handler: type[BaseHTTPRequestHandler], calls: int) -> float:
    """Median µs of server-thread CPU per filter request (the read of the request line included)."""
    cpu: list[int] = []
    handler.cpu = cpu  # type: ignore[attr-defined]
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    request = (b"POST /filter HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: Go-http-client/1.1\r\n"
               b"Content-Type: application/json\r\nAccept-Encoding: gzip\r\nContent-Length: %d\r\n\r\n%s"
               % (len(FILTER_BODY), FILTER_BODY))
    try:
        with socket.create_connection(httpd.server_address[:2]) as s:
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            f = s.makefile("rb")
            for _ in range(calls + 1):
                s.sendall(request)
                length = 0
                while (line := f.readline()) not in (b"\r\n", b""):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                f.read(length)
        # the last request's figure lands once the server loops back to read the (closed) connection
        deadline = time.monotonic() + 5
        while len(cpu) < calls + 1 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        httpd.shutdown()
        httpd.server_close()
    return statistics.median(cpu[1:calls + 1]) / 1000


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--calls", type=int, default=300, help="binds / requests per round")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    import kubernetes.client

    runs: dict[str, list[float]] = {k: [] for k in (
        "bind generated", "bind urllib3", "bind podwriter", "serve stdlib", "serve lean")}
    with KubeApiStandin() as kube:
        api = kube.api_client()
        writers = {"bind generated": bind_generated(kubernetes.client.CoreV1Api(api)),
                   "bind urllib3": bind_urllib3(api), "bind podwriter": bind_podwriter(PodWriter(api))}
        for _ in range(args.repeats):
            for label, write in writers.items():
                runs[label].append(measure_binds(kube, label.split()[1], write, args.calls))
            runs["serve stdlib"].append(measure_serving(StdlibHandler, args.calls))
            runs["serve lean"].append(measure_serving(LeanHandler, args.calls))
    results = {k: round(statistics.median(v), 1) for k, v in runs.items()}
    if args.json:
        print(json.dumps({"unit": "us_cpu_per_call", "calls": args.calls, "repeats": args.repeats, **results}))
    else:
        print(f"CPU per call, median of {args.repeats} rounds of {args.calls} (µs)")
        for k, v in results.items():
            print(f"  {k:16s} {v:8.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
