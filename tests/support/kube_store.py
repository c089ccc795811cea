"""The Kubernetes API stand-in's store layer: objects, resourceVersions, the event log behind watches,
field/label selectors, patches and preconditions; no HTTP (tests/support/kube_standin.py serves this over the
wire). Every verb here takes decoded arguments and returns the object (or raises ApiError, which the HTTP
layer answers as a Status); the caller never holds `Store.cond` except to make several writes atomic.

JSON patch (RFC 6902) is the `jsonpatch` library and JSON merge patch (RFC 7386) is `json-merge-patch`;
strategic merge patch (Kubernetes' own, no Python library) is merge patch plus "lists of objects that all
have a `name` merge by name", which is what the clients under test send.
"""

from __future__ import annotations

import bisect
import json
import re
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import json_merge_patch
import jsonpatch
import jsonpointer
import orjson

# plural -> (Kind, namespaced)
RESOURCES: dict[str, tuple[str, bool]] = {
    "nodes": ("Node", False),
    "pods": ("Pod", True),
    "events": ("Event", True),
    "configmaps": ("ConfigMap", True),
    "secrets": ("Secret", True),
}
KIND_TO_PLURAL = {kind.lower(): plural for plural, (kind, _) in RESOURCES.items()}
# plural -> apiVersion, for resources outside core/v1 (served under /apis/<group>/<version>); modules such as
# kube_standin_dra.py add theirs (with RESOURCES and KIND_TO_PLURAL entries).
API_VERSIONS: dict[str, str] = {}
EVENT_WINDOW = 200_000  # events kept for watch replay; older ones are compacted away


def _plural(kind: str) -> str:
    k = kind.lower()
    if k in RESOURCES:
        return k
    if k in KIND_TO_PLURAL:
        return KIND_TO_PLURAL[k]
    raise ValueError(f"unknown kind {kind!r}; known: {sorted(RESOURCES)}")


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class ApiError(Exception):
    """An API error answered as a Status object."""

    def __init__(self, code: int, reason: str, message: str, name: str = "", kind: str = "") -> None:
        super().__init__(message)
        self.code, self.reason, self.message, self.name, self.kind = code, reason, message, name, kind

    def status(self) -> dict[str, Any]:
        return status_object(self.code, self.reason, self.message, self.name, self.kind)


def status_object(code: int, reason: str, message: str, name: str = "", kind: str = "") -> dict[str, Any]:
    st: dict[str, Any] = {"kind": "Status", "apiVersion": "v1", "metadata": {},
                          "status": "Success" if code < 300 else "Failure", "code": code}
    if code >= 300:
        st["message"] = message
        st["reason"] = reason
    if name or kind:
        st["details"] = {"name": name, "kind": kind}
    return st


# ---------------------------------------------------------------------------------------------- selectors

def _field_value(obj: dict[str, Any], path: str) -> str:
    cur: Any = obj
    for part in path.split("."):
        if not isinstance(cur, dict):
            return ""
        cur = cur.get(part)
    if cur is None:
        return ""
    return cur if isinstance(cur, str) else json.dumps(cur)


def parse_field_selector(sel: str) -> list[tuple[str, str, str]]:
    terms = []
    for term in filter(None, (t.strip() for t in sel.split(","))):
        m = re.fullmatch(r"([A-Za-z0-9_.\-/]+)\s*(==|!=|=)\s*(.*)", term)
        if not m:
            raise ApiError(400, "BadRequest", f"invalid field selector term {term!r}")
        terms.append((m.group(1), "!=" if m.group(2) == "!=" else "=", m.group(3)))
    return terms


def parse_label_selector(sel: str) -> list[tuple[str, str, tuple[str, ...]]]:
    terms: list[tuple[str, str, tuple[str, ...]]] = []
    # split on commas that are not inside parentheses
    parts, depth, cur = [], 0, ""
    for ch in sel:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    for term in filter(None, (p.strip() for p in parts)):
        if m := re.fullmatch(r"([\w./\-]+)\s+(in|notin)\s+\((.*)\)", term):
            vals = tuple(v.strip() for v in m.group(3).split(",") if v.strip())
            terms.append((m.group(1), m.group(2), vals))
        elif m := re.fullmatch(r"([\w./\-]+)\s*(==|!=|=)\s*([\w./\-]*)", term):
            terms.append((m.group(1), "!=" if m.group(2) == "!=" else "=", (m.group(3),)))
        elif m := re.fullmatch(r"!\s*([\w./\-]+)", term):
            terms.append((m.group(1), "!", ()))
        elif m := re.fullmatch(r"([\w./\-]+)", term):
            terms.append((m.group(1), "exists", ()))
        else:
            raise ApiError(400, "BadRequest", f"invalid label selector term {term!r}")
    return terms


@dataclass(frozen=True)
class Selector:
    fields: tuple[tuple[str, str, str], ...] = ()
    labels: tuple[tuple[str, str, tuple[str, ...]], ...] = ()
    namespace: str | None = None

    def matches(self, obj: dict[str, Any] | None) -> bool:
        if obj is None:
            return False
        meta = obj.get("metadata") or {}
        if self.namespace is not None and meta.get("namespace") != self.namespace:
            return False
        for path, op, want in self.fields:
            if (_field_value(obj, path) == want) != (op == "="):
                return False
        labels = meta.get("labels") or {}
        for key, op, vals in self.labels:
            have = labels.get(key)
            ok = {
                "=": have == vals[0] if vals else False,
                "!=": have != (vals[0] if vals else None),
                "in": have in vals,
                "notin": have not in vals,
                "exists": have is not None,
                "!": have is None,
            }[op]
            if not ok:
                return False
        return True


# ---------------------------------------------------------------------------------------------- patches

def merge_patch(target: Any, patch: Any, strategic: bool = False) -> Any:
    """RFC 7386 JSON merge patch (json-merge-patch); with `strategic`, lists of objects that all have `name`
    merge by name and `$` directives are dropped (the part of strategic merge patch the clients here use)."""
    if strategic and isinstance(patch, dict) and isinstance(target, dict):
        plain, named = {}, {}
        for key, value in patch.items():
            if key.startswith("$"):
                continue
            cur = target.get(key)
            if (isinstance(value, list) and value and isinstance(cur, list) and _named(value) and _named(cur)):
                named[key] = _merge_named(cur, value)
            elif isinstance(value, dict) and isinstance(cur, dict):
                named[key] = merge_patch(cur, value, strategic=True)
            else:
                plain[key] = value
        result = json_merge_patch.merge(_clone(target), _clone(plain))
        result.update(named)
        return result
    return json_merge_patch.merge(_clone(target), _clone(patch))


def _named(items: list[Any]) -> bool:
    return all(isinstance(v, dict) and "name" in v for v in items)


def _merge_named(current: list[dict[str, Any]], patch: list[dict[str, Any]]) -> list[dict[str, Any]]:
    merged = [_clone(item) for item in current]
    index = {item["name"]: i for i, item in enumerate(merged)}
    for item in patch:
        if item["name"] in index:
            merged[index[item["name"]]] = merge_patch(merged[index[item["name"]]], item, strategic=True)
        else:
            merged.append(_clone(item))
    return merged


def json_patch(doc: Any, ops: Any) -> Any:
    """RFC 6902 (jsonpatch): errors answered as the real server does (400 malformed, 422 not applicable)."""
    if not isinstance(ops, list):
        raise ApiError(400, "BadRequest", "a json-patch body must be a JSON list of operations")
    try:
        return jsonpatch.JsonPatch(ops).apply(_clone(doc), in_place=True)
    except jsonpatch.InvalidJsonPatch as exc:
        raise ApiError(400, "BadRequest", f"invalid json-patch: {exc}") from None
    except (jsonpatch.JsonPatchException, jsonpointer.JsonPointerException) as exc:
        raise ApiError(422, "Invalid", f"json-patch: {exc}") from None
    except (TypeError, ValueError, KeyError, IndexError) as exc:  # e.g. an op that is not an object
        raise ApiError(400, "BadRequest", f"invalid json-patch: {exc!r}") from None


# ---------------------------------------------------------------------------------------------- store

@dataclass(frozen=True)
class Event:
    rv: int
    plural: str
    type: str  # ADDED MODIFIED DELETED
    obj: dict[str, Any]
    prev: dict[str, Any] | None


class Store:
    """Objects by (plural, namespace, name), a global resourceVersion and an event log for watches."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.rv = 1
        self.compacted = 0  # watches from a resourceVersion <= this get 410 Gone
        self.objects: dict[tuple[str, str | None, str], dict[str, Any]] = {}
        self.events: list[Event] = []
        self.event_rvs: list[int] = []
        self.generation = 0  # bumped by restart(): open watches end
        self.snapshots: dict[str, tuple[int, list[dict[str, Any]]]] = {}  # continue token -> (rv, rest)
        self.snapshot_seq = 0

    def _emit(self, plural: str, type_: str, obj: dict[str, Any], prev: dict[str, Any] | None) -> None:
        ev = Event(int(obj["metadata"]["resourceVersion"]), plural, type_, obj, prev)
        self.events.append(ev)
        self.event_rvs.append(ev.rv)
        if len(self.events) > EVENT_WINDOW:
            drop = len(self.events) - EVENT_WINDOW // 2
            self.compacted = max(self.compacted, self.event_rvs[drop - 1])
            del self.events[:drop]
            del self.event_rvs[:drop]
        self.cond.notify_all()

    def write(self, plural: str, obj: dict[str, Any], create: bool) -> dict[str, Any]:
        """Store `obj` (already validated) as a new version; caller holds cond."""
        meta = obj["metadata"]
        key = (plural, meta.get("namespace"), meta["name"])
        prev = self.objects.get(key)
        self.rv += 1
        meta["resourceVersion"] = str(self.rv)
        if prev is None:
            meta.setdefault("uid", str(uuid.uuid4()))
            meta.setdefault("creationTimestamp", _now())
        else:
            meta["uid"] = prev["metadata"]["uid"]
            meta["creationTimestamp"] = prev["metadata"]["creationTimestamp"]
        kind, _ = RESOURCES[plural]
        obj["kind"], obj["apiVersion"] = kind, API_VERSIONS.get(plural, "v1")
        if plural == "pods":
            obj.setdefault("spec", {})
            obj.setdefault("status", {}).setdefault("phase", "Pending")
        self.objects[key] = obj
        self._emit(plural, "ADDED" if prev is None else "MODIFIED", obj, prev)
        return obj

    def remove(self, plural: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        prev = self.objects.pop((plural, namespace, name), None)
        if prev is None:
            return None
        self.rv += 1
        gone = _clone(prev)
        gone["metadata"]["resourceVersion"] = str(self.rv)
        self._emit(plural, "DELETED", gone, prev)
        return gone

    def end_watches(self) -> None:
        """Every open watch_events() iterator ends (an API-server restart)."""
        with self.cond:
            self.generation += 1
            self.cond.notify_all()

    def compact(self) -> int:
        """Every resourceVersion so far becomes too old; returns the compaction point."""
        with self.cond:
            self.compacted = self.rv
            self.rv += 1  # a fresh list returns a version past the compaction point
            self.events.clear()
            self.event_rvs.clear()
            return self.compacted

    # ---- direct access for tests (plain dicts in and out, copies)
    def put(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Create or replace a Node/Pod/... from a plain dict; returns the stored copy."""
        plural = _plural(obj.get("kind", ""))
        obj = _clone(obj)
        meta = obj.setdefault("metadata", {})
        if not meta.get("name"):
            raise ValueError("put(): metadata.name is required")
        if RESOURCES[plural][1]:
            meta.setdefault("namespace", "default")
        else:
            meta.pop("namespace", None)
        meta.pop("resourceVersion", None)
        with self.cond:
            return _clone(self.write(plural, obj, create=False))

    def get(self, kind: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        plural = _plural(kind)
        ns = (namespace or "default") if RESOURCES[plural][1] else None
        with self.cond:
            obj = self.objects.get((plural, ns, name))
            return _clone(obj) if obj is not None else None

    def list(self, kind: str, namespace: str | None = None) -> list[dict[str, Any]]:
        plural = _plural(kind)
        with self.cond:
            return [_clone(o) for (p, ns, _), o in self.objects.items()
                    if p == plural and (namespace is None or ns == namespace)]

    def drop(self, kind: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        plural = _plural(kind)
        ns = (namespace or "default") if RESOURCES[plural][1] else None
        with self.cond:
            gone = self.remove(plural, ns, name)
            return _clone(gone) if gone else None

    # ---- verbs (decoded arguments in, stored objects out; ApiError for every refusal)
    @staticmethod
    def selector(ns: str | None, query: dict[str, str]) -> Selector:
        return Selector(tuple(parse_field_selector(query.get("fieldSelector", ""))),
                        tuple(parse_label_selector(query.get("labelSelector", ""))), ns)

    def read(self, plural: str, ns: str | None, name: str | None, query: dict[str, str]) -> dict[str, Any]:
        kind, _ = RESOURCES[plural]
        if name is not None:
            with self.cond:
                obj = self.objects.get((plural, ns, name))
                if obj is None:
                    raise ApiError(404, "NotFound", f'{plural} "{name}" not found', name, plural)
                return obj  # stored objects are never mutated in place
        sel = self.selector(ns, query)
        limit = int(query["limit"]) if query.get("limit", "").isdigit() and int(query["limit"]) > 0 else 0
        token = query.get("continue", "")
        with self.cond:
            if token:  # a consistent snapshot, as the real server gives (paged lists)
                snap = self.snapshots.get(token)
                if snap is None or snap[0] <= self.compacted:
                    raise ApiError(410, "Expired", "The provided continue parameter is too old to display a "
                                                   "consistent list result. You can start a new list without "
                                                   "the continue parameter.")
                rv, items = snap
            else:
                items = sorted((o for (p, _, _), o in self.objects.items()
                                if p == plural and sel.matches(o)),
                               key=lambda o: (o["metadata"].get("namespace") or "", o["metadata"]["name"]))
                rv = self.rv
            meta: dict[str, Any] = {"resourceVersion": str(rv)}
            if limit and len(items) > limit:
                self.snapshot_seq += 1
                next_token = f"standin-{self.snapshot_seq}"
                self.snapshots[next_token] = (rv, items[limit:])
                if len(self.snapshots) > 1000:
                    del self.snapshots[next(iter(self.snapshots))]
                items = items[:limit]
                meta["continue"] = next_token
                meta["remainingItemCount"] = len(self.snapshots[next_token][1])
            self.snapshots.pop(token, None)
        return {"kind": f"{kind}List", "apiVersion": API_VERSIONS.get(plural, "v1"), "metadata": meta,
                "items": items}

    def _validate_new(self, plural: str, ns: str | None, body: Any) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise ApiError(400, "BadRequest", "the request body must be a JSON object")
        kind, namespaced = RESOURCES[plural]
        if body.get("kind") not in (None, kind):
            raise ApiError(400, "BadRequest", f"kind {body.get('kind')!r} does not match {kind}")
        meta = body.setdefault("metadata", {})
        if not isinstance(meta, dict):
            raise ApiError(400, "BadRequest", "metadata must be an object")
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        if not meta.get("name"):
            raise ApiError(422, "Invalid", "metadata.name: Required value")
        if namespaced:
            if meta.get("namespace") not in (None, ns):
                raise ApiError(400, "BadRequest", "the namespace of the object does not match the request")
            meta["namespace"] = ns
        else:
            meta.pop("namespace", None)
        if plural == "events":
            validate_event(body, ns)
        return body

    def create(self, plural: str, ns: str | None, body: Any) -> dict[str, Any]:
        obj = self._validate_new(plural, ns, body)
        with self.cond:
            key = (plural, ns, obj["metadata"]["name"])
            if key in self.objects:
                raise ApiError(409, "AlreadyExists", f'{plural} "{key[2]}" already exists', key[2], plural)
            obj["metadata"].pop("resourceVersion", None)
            obj["metadata"].pop("uid", None)
            return self.write(plural, obj, create=True)

    def current(self, plural: str, ns: str | None, name: str) -> dict[str, Any]:
        obj = self.objects.get((plural, ns, name))
        if obj is None:
            raise ApiError(404, "NotFound", f'{plural} "{name}" not found', name, plural)
        return obj

    def commit(self, plural: str, ns: str | None, name: str, sub: str | None, cur: dict[str, Any],
                new: Any, precondition_rv: str | None) -> dict[str, Any]:
        """Apply `new` (a full object) over `cur` honouring subresource rules and immutable fields."""
        if not isinstance(new, dict):
            raise ApiError(400, "BadRequest", "the resulting object must be a JSON object")
        if precondition_rv and precondition_rv != cur["metadata"]["resourceVersion"]:
            raise ApiError(409, "Conflict", f'Operation cannot be fulfilled on {plural} "{name}": the object '
                                            "has been modified; please apply your changes to the latest "
                                            "version and try again", name, plural)
        meta = new.get("metadata")
        if not isinstance(meta, dict):
            raise ApiError(400, "BadRequest", "metadata must be an object")
        if meta.get("name", name) != name or (ns is not None and meta.get("namespace", ns) != ns):
            raise ApiError(400, "BadRequest", "the name/namespace of the object does not match the request")
        if sub == "status":
            obj = _clone(cur)
            obj["status"] = new.get("status", {})
        else:
            obj = new
            if "status" in cur:
                obj["status"] = _clone(cur["status"])  # the main resource ignores status
            if plural == "pods":
                old_node = (cur.get("spec") or {}).get("nodeName")
                if (obj.get("spec") or {}).get("nodeName") != old_node and old_node:
                    raise ApiError(422, "Invalid", "spec.nodeName: pod updates may not change nodeName",
                                   name, plural)
        obj["metadata"]["name"] = name
        if ns is not None:
            obj["metadata"]["namespace"] = ns
        return self.write(plural, obj, create=False)

    def update(self, plural: str, ns: str | None, name: str, sub: str | None, body: Any) -> dict[str, Any]:
        if not isinstance(body, dict) or not isinstance(body.get("metadata"), dict):
            raise ApiError(400, "BadRequest", "the request body must be an object with metadata")
        with self.cond:
            cur = self.current(plural, ns, name)
            return self.commit(plural, ns, name, sub, cur, body, body["metadata"].get("resourceVersion"))

    def patch(self, plural: str, ns: str | None, name: str, sub: str | None, body: Any,
              content_type: str) -> dict[str, Any]:
        """`body` (decoded JSON) applied as the patch `content_type` names; in a merge patch,
        `metadata.resourceVersion` is a precondition (409 when it is not the current one)."""
        ctype = content_type.split(";")[0].strip()
        with self.cond:
            cur = self.current(plural, ns, name)
            if ctype == "application/json-patch+json":
                new = json_patch(cur, body)
                want_rv = None  # a json-patch precondition is a "test" op
            elif ctype in ("application/merge-patch+json", "application/strategic-merge-patch+json"):
                if not isinstance(body, dict):
                    raise ApiError(400, "BadRequest", "a merge patch must be a JSON object")
                meta = body.get("metadata")
                want_rv = meta.get("resourceVersion") if isinstance(meta, dict) else None
                new = merge_patch(cur, body, strategic=ctype.startswith("application/strategic"))
            else:
                raise ApiError(415, "UnsupportedMediaType", f"the patch content type {ctype!r} is not "
                               "supported (json-patch, merge-patch, strategic-merge-patch)")
            return self.commit(plural, ns, name, sub, cur, new, want_rv)

    def delete(self, plural: str, ns: str | None, name: str, opts: Any) -> dict[str, Any]:
        with self.cond:
            cur = self.current(plural, ns, name)
            pre = (opts or {}).get("preconditions") if isinstance(opts, dict) else None
            if isinstance(pre, dict):
                if pre.get("uid") and pre["uid"] != cur["metadata"]["uid"]:
                    raise ApiError(409, "Conflict", f"Precondition failed: UID in precondition: "
                                                    f"{pre['uid']}, UID in object meta: "
                                                    f"{cur['metadata']['uid']}", name, plural)
                cur_rv = cur["metadata"]["resourceVersion"]
                if pre.get("resourceVersion") and pre["resourceVersion"] != cur_rv:
                    raise ApiError(409, "Conflict", "Precondition failed: resourceVersion", name, plural)
            gone = self.remove(plural, ns, name)
            assert gone is not None
            return gone

    def bind(self, ns: str | None, name: str | None, body: Any) -> dict[str, Any]:
        if not isinstance(body, dict) or not isinstance(body.get("target"), dict) \
                or not body["target"].get("name"):
            raise ApiError(400, "BadRequest", "a Binding needs target.name")
        meta = body.get("metadata") if isinstance(body.get("metadata"), dict) else {}
        if meta.get("name") not in (None, name):
            raise ApiError(400, "BadRequest", "the Binding's name does not match the pod")
        with self.cond:
            cur = self.current("pods", ns, name or "")
            conflict = None
            if meta.get("uid") and meta["uid"] != cur["metadata"]["uid"]:
                conflict = f"Precondition failed: UID in precondition: {meta['uid']}"
            elif meta.get("resourceVersion") and meta["resourceVersion"] != cur["metadata"][
                    "resourceVersion"]:
                conflict = "the object has been modified"
            elif (cur.get("spec") or {}).get("nodeName"):
                conflict = f'pod {name} is already assigned to node "{cur["spec"]["nodeName"]}"'
            if conflict:
                raise ApiError(409, "Conflict", f'Operation cannot be fulfilled on pods/binding "{name}": '
                                                f"{conflict}", name or "", "pods/binding")
            obj = _clone(cur)
            obj["spec"]["nodeName"] = body["target"]["name"]
            if meta.get("annotations"):
                obj["metadata"].setdefault("annotations", {}).update(meta["annotations"])
            conds = [c for c in obj.setdefault("status", {}).get("conditions", [])
                     if c.get("type") != "PodScheduled"]
            conds.append({"type": "PodScheduled", "status": "True", "lastTransitionTime": _now()})
            obj["status"]["conditions"] = conds
            self.write("pods", obj, create=False)
        return status_object(201, "", "")

    def watch_events(self, plural: str, sel: Selector, rv_param: str, deadline: float,
                     bookmarks: bool) -> Iterator[dict[str, Any]]:
        """The events a watch from `rv_param` sees until `deadline` (then a BOOKMARK, when asked for), an
        ERROR 410 for a compacted version, or the end when end_watches() is called."""
        with self.cond:
            generation = self.generation
            if rv_param in ("", "0"):
                initial = [o for (p, _, _), o in self.objects.items() if p == plural and sel.matches(o)]
                cursor = self.rv
            else:
                cursor = int(rv_param)
                initial = []
                if cursor <= self.compacted:
                    gone = status_object(410, "Expired", f"too old resource version: {cursor} "
                                                         f"({self.compacted + 1})")
                    initial = None
        if initial is None:
            yield {"type": "ERROR", "object": gone}
            return
        for obj in initial:
            yield {"type": "ADDED", "object": obj}
        while True:
            batch: list[dict[str, Any]] = []
            with self.cond:
                while True:
                    if self.generation != generation:
                        return
                    if cursor < self.compacted:
                        yield_gone = status_object(410, "Expired", "too old resource version")
                        batch = [{"type": "ERROR", "object": yield_gone}]
                        break
                    i = bisect.bisect_right(self.event_rvs, cursor)
                    if i < len(self.events):
                        for ev in self.events[i:]:
                            cursor = ev.rv
                            if ev.plural != plural:
                                continue
                            out = _translate(ev, sel)
                            if out:
                                batch.append(out)
                        if batch:
                            break
                    left = deadline - time.monotonic()
                    if left <= 0:
                        if bookmarks:
                            batch = [{"type": "BOOKMARK", "object": {
                                "kind": RESOURCES[plural][0], "apiVersion": "v1",
                                "metadata": {"resourceVersion": str(self.rv)}}}]
                        else:
                            return
                        break
                    self.cond.wait(min(left, 1.0))
            yield from batch  # outside the lock: a slow reader never blocks writers
            if batch[-1]["type"] in ("ERROR", "BOOKMARK"):
                return


def _clone(obj: Any) -> Any:
    """A deep copy of JSON data (several times faster than copy.deepcopy)."""
    return orjson.loads(orjson.dumps(obj))


def _translate(ev: Event, sel: Selector) -> dict[str, Any] | None:
    """An event as a watcher with selector `sel` sees it (a change in matching becomes ADDED/DELETED)."""
    now = ev.type != "DELETED" and sel.matches(ev.obj)
    before = ev.prev is not None and sel.matches(ev.prev)
    if ev.type == "DELETED":
        return {"type": "DELETED", "object": ev.obj} if before else None
    if now and before:
        return {"type": "MODIFIED", "object": ev.obj}
    if now:
        return {"type": "ADDED", "object": ev.obj}
    if before:  # stopped matching: the real watch cache sends the previous content at the new version
        assert ev.prev is not None
        prev = _clone(ev.prev)
        prev["metadata"]["resourceVersion"] = str(ev.rv)
        return {"type": "DELETED", "object": prev}
    return None


def validate_event(body: dict[str, Any], ns: str | None) -> None:
    """What the real server checks of a core/v1 Event at create (pkg/apis/core/validation, legacy
    validation): an involvedObject naming a kind and a name, in the Event's own namespace (for v1 the
    namespaces must match), a reason and message within their limits."""
    obj = body.get("involvedObject")
    if not isinstance(obj, dict) or not obj.get("kind") or not obj.get("name"):
        raise ApiError(422, "Invalid", "involvedObject: Required value: kind and name")
    if obj.get("namespace", "") and obj.get("namespace") != ns:
        raise ApiError(422, "Invalid", f"involvedObject.namespace: Invalid value: {obj.get('namespace')!r}: "
                                       f"does not match event.namespace")
    if len(str(body.get("reason", ""))) > 128:
        raise ApiError(422, "Invalid", "reason: Too long: may not be more than 128 bytes")
    if body.get("type") not in (None, "Normal", "Warning"):
        raise ApiError(422, "Invalid", f"type: Unsupported value: {body.get('type')!r}")
