"""List + watch of nodes and pods through the official `kubernetes` client, feeding ClusterState.

Each Informer: list (paged, `limit`/`continue`) → replace the state → watch from the list's
resourceVersion (with bookmarks) → apply events; when a watch ends (server timeout), watch again from the
last resourceVersion seen; when the connection breaks (API-server restart), back off briefly and watch
again from it; on 410 Gone (the version was compacted away), list again.

Why the raw response (`_preload_content=False`) instead of `kubernetes.watch.Watch`: that helper turns
every event into a pydantic model (slow and memory-hungry for 40,000 pods: the extender needs a few fields
of each), and with `deserialize=False` its ERROR/410 handling fails; here the lines are parsed as JSON and
410 is handled explicitly. The requests themselves are made by the official client.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable
from typing import Any

import orjson

from memslice import errors

log = logging.getLogger(__name__)

PAGE_SIZE = 500


class Gone(errors.UnavailableError):
    """The resourceVersion is too old (410): list again."""


class Informer:
    def __init__(self, kind: str, list_fn: Callable[..., Any], *,
                 on_replace: Callable[[list[Any], int], None],
                 on_upsert: Callable[[dict[str, Any]], None],
                 on_delete: Callable[[dict[str, Any]], None],
                 synced: threading.Event, stop: threading.Event,
                 field_selector: str | None = None, watch_timeout: int = 300,
                 on_restart: Callable[[str, str], None] | None = None,
                 convert: Callable[[dict[str, Any]], Any] = lambda obj: obj) -> None:
        self.kind = kind
        self.list_fn = list_fn
        self.on_replace, self.on_upsert, self.on_delete = on_replace, on_upsert, on_delete
        self.synced = synced
        self.stop_event = stop
        self.field_selector = field_selector
        self.watch_timeout = watch_timeout
        self.on_restart = on_restart or (lambda kind, reason: None)
        self.convert = convert  # applied to listed items page by page (keeps relists small)
        self.resource_version = ""
        self._resp: Any = None
        self._thread: threading.Thread | None = None

    def start(self) -> Informer:
        self._thread = threading.Thread(target=self.run, name=f"informer-{self.kind}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self.stop_event.set()
        resp = self._resp
        if resp is not None:
            try:
                resp.shutdown()
            except Exception:  # noqa: BLE001 - best effort: the thread is a daemon
                pass

    def join(self, timeout: float) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def _kwargs(self) -> dict[str, Any]:
        return {"field_selector": self.field_selector} if self.field_selector else {}

    def relist(self) -> None:
        items: list[Any] = []
        token = None
        rv = ""
        while True:
            kwargs = self._kwargs() | {"limit": PAGE_SIZE, "_preload_content": False, "_request_timeout": 60}
            if token:
                kwargs["_continue"] = token
            resp = self.list_fn(**kwargs)
            page = orjson.loads(resp.data)
            resp.release_conn()
            meta = page.get("metadata") or {}
            if not rv:
                rv = meta.get("resourceVersion") or ""
            items.extend(self.convert(obj) for obj in page.get("items") or [])
            del page
            token = meta.get("continue")
            if not token:
                break
        self.on_replace(items, int(rv) if rv.isdigit() else 0)
        self.resource_version = rv
        self.synced.set()
        log.info("listed %d %s at resourceVersion %s", len(items), self.kind, rv)

    def watch_once(self) -> None:
        """One watch request from self.resource_version until the server ends it; raises Gone on 410."""
        timeout = int(self.watch_timeout * random.uniform(0.9, 1.0)) or 1
        resp = self.list_fn(**self._kwargs(), watch=True, resource_version=self.resource_version,
                            timeout_seconds=timeout, allow_watch_bookmarks=True, _preload_content=False,
                            _request_timeout=(10, timeout + 30))
        self._resp = resp
        try:
            buf = b""
            for chunk in resp.stream(amt=None, decode_content=False):
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    if line.strip():
                        self._event(orjson.loads(line))
                if self.stop_event.is_set():
                    return
        finally:
            self._resp = None
            resp.release_conn()

    def _event(self, ev: dict[str, Any]) -> None:
        kind, obj = ev.get("type"), ev.get("object") or {}
        if kind == "ERROR":
            code = obj.get("code")
            if code == 410:
                raise Gone(obj.get("message", "410 Gone"))
            raise RuntimeError(f"watch error {code}: {obj.get('message')}")
        rv = (obj.get("metadata") or {}).get("resourceVersion")
        if kind in ("ADDED", "MODIFIED"):
            self.on_upsert(obj)
        elif kind == "DELETED":
            self.on_delete(obj)
        if rv:
            self.resource_version = rv

    def run(self) -> None:
        from kubernetes.client.exceptions import ApiException

        backoff = 0.05
        need_list = True
        while not self.stop_event.is_set():
            try:
                if need_list:
                    self.relist()
                    need_list = False
                self.watch_once()
                backoff = 0.05
            except Gone as exc:
                log.info("%s watch: %s; listing again", self.kind, exc)
                self.on_restart(self.kind, "gone")
                need_list = True
            except ApiException as exc:
                if exc.status == 410:
                    self.on_restart(self.kind, "gone")
                    need_list = True
                    continue
                log.warning("%s list/watch failed: %s %s; retrying in %.2f s", self.kind, exc.status,
                            exc.reason, backoff)
                self.on_restart(self.kind, "error")
                self.stop_event.wait(backoff)
                backoff = min(backoff * 2, 5.0)
            except Exception as exc:  # noqa: BLE001 - connection drops, bad JSON: retry, never die
                if self.stop_event.is_set():
                    break
                log.warning("%s list/watch interrupted (%s: %s); retrying in %.2f s", self.kind,
                            type(exc).__name__, exc, backoff)
                self.on_restart(self.kind, "error")
                self.stop_event.wait(backoff)
                backoff = min(backoff * 2, 5.0)
