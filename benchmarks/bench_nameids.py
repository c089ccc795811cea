"""The memo's name index, Python against C: what a filter and a prioritize of every node cost in its reads.

    .venv/bin/python benchmarks/bench_nameids.py [--nodes 5000] [--requests 40] [--rounds 5] [--cold-mib 64]
        [--json]

For each request (a shuffled list of all node names, decoded from JSON with orjson as the server decodes
it, so the strings are new objects), both implementations of scheduler_extender/index/nameids.py do what the
memo does with it: `ids` (name -> node id), `take` (each id's verdict kind), `join` (prioritize's answer:
the kept HostPriority texts of the ids, joined and encoded) and `same` (prioritize's names against the
very names its filter passed: equal lists of distinct string objects). Before each timed step the caches
are flushed by writing --cold-mib MiB (0: warm), as the other work of a busy extender and its neighbours
do between two requests: a lookup is then bound by memory reads, not instructions. The node names live
among other objects (parsed out of Node-like JSON), as the extender's do. Medians per step, in us.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from collections.abc import Callable
from typing import Any

import orjson

from memslice.scheduler_extender.index import nameids


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=5000)
    p.add_argument("--requests", type=int, default=40, help="requests per round")
    p.add_argument("--rounds", type=int, default=5, help="rounds, the implementations alternating")
    p.add_argument("--cold-mib", type=int, default=64, help="MiB written before each timed step (0: warm)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    if nameids._native is None:
        raise SystemExit("the native module is not built: `make install` builds it")
    rng = random.Random(1)
    nodes: list[Any] = []
    for n in range(args.nodes):  # node names inside parsed objects, with other objects between them
        nodes.append(orjson.loads(orjson.dumps({"metadata": {"name": f"node-{n:05d}", "labels": {"a": "b" * 40}}})))
        nodes.append(orjson.loads(orjson.dumps({"spec": {"x": "y" * 60}})))
    names = [o["metadata"]["name"] for o in nodes[::2]]
    impls: dict[str, nameids.NameIds] = {"python": nameids.NameIds(), "native": nameids.NativeNameIds()}
    for index in impls.values():
        for i, name in enumerate(names):
            index.set(name, i)
    kinds = bytearray(rng.choice((1, 1, 1, 2)) for _ in names)
    texts: list[str | None] = []
    for name in names:  # scattered, as the memo's texts are (made one by one as nodes are met)
        texts.append(f'{{"Host":"{name}","Score":{rng.randint(0, 10)}}}')
        nodes.append(orjson.loads(orjson.dumps({"z": "w" * 30})))
    bodies = []
    for _ in range(args.requests):
        order = names[:]
        rng.shuffle(order)
        bodies.append(orjson.dumps({"NodeNames": order}))
    flush = bytearray(args.cold_mib << 20)

    def cold() -> None:
        if flush:
            flush[::64] = b"\1" * (len(flush) // 64)

    def timed(fn: Callable[..., Any], *fn_args: Any) -> tuple[float, Any]:
        """(us, answer) of one call, the caches flushed first."""
        cold()
        t0 = time.perf_counter_ns()
        answer = fn(*fn_args)
        return (time.perf_counter_ns() - t0) / 1000, answer

    steps = ("ids", "take", "join", "same")
    samples: dict[str, dict[str, list[float]]] = {impl: {s: [] for s in steps} for impl in impls}
    answers: dict[str, list[Any]] = {impl: [] for impl in impls}
    for r in range(args.rounds):
        for impl in (list(impls) if r % 2 == 0 else list(impls)[::-1]):
            index = impls[impl]
            for body in bodies:
                request = orjson.loads(body)["NodeNames"]
                kept = orjson.loads(body)["NodeNames"]  # filter's names: equal, other objects
                got = {}
                for step, fn, fn_args in (("ids", index.ids, (request,)), ("take", index.take, (kinds,)),
                                          ("join", index.join, (texts,)), ("same", index.same, (kept, request))):
                    us, got[step] = timed(fn, *(fn_args if step in ("ids", "same") else (*fn_args, got["ids"])))
                    samples[impl][step].append(us)
                if r == 0 and body is bodies[0]:
                    answers[impl] = [index.to_list(got["ids"]), got["take"], got["join"], got["same"]]
    assert answers["python"] == answers["native"], "the implementations disagree"
    result = {"nodes": args.nodes, "requests": args.requests * args.rounds, "cold_mib": args.cold_mib,
              "median_us": {impl: {s: round(statistics.median(v), 1) for s, v in steps_.items()}
                            for impl, steps_ in samples.items()}}
    med = result["median_us"]
    result["python_over_native"] = {s: round(med["python"][s] / med["native"][s], 1) for s in steps}
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"name index, {args.nodes} names per request, {result['requests']} requests per implementation, "
          f"caches flushed with {args.cold_mib} MiB before each step; median us")
    print(f"  {'step':6} {'python':>9} {'native':>9} {'ratio':>6}")
    for s in steps:
        print(f"  {s:6} {med['python'][s]:9.1f} {med['native'][s]:9.1f} {result['python_over_native'][s]:6.1f}")
    total = {impl: sum(med[impl].values()) for impl in impls}
    print(f"  {'all':6} {total['python']:9.1f} {total['native']:9.1f} {total['python'] / total['native']:6.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
