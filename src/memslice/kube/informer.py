"""List + watch of one kind through the official `kubernetes` client: the informer of the extender (nodes,
pods) and the node agent.

Loop: list (paged, `limit`/`continue`, each page converted before the next is read, so a relist of 250,000
pods never holds them all as raw JSON) → replace → watch from the list's resourceVersion (with bookmarks) →
apply events; when a watch ends (server timeout), watch again from the last resourceVersion seen (bookmarks
keep it fresh); when the connection breaks (API-server restart) back off (backoff.py) and watch again from
it; on 410 Gone (the version was compacted away, from the watch or a continue token), list again.

Why the raw response (`_preload_content=False`) instead of `kubernetes.watch.Watch`: that helper builds a
model object per event (slow and memory-hungry for 40,000 pods when a few fields of each are needed), and
with `deserialize=False` its ERROR/410 handling fails; here the lines are parsed with orjson and 410 is
handled explicitly. The requests themselves are made by the official client.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable, Iterator
from typing import Any

import orjson

from .. import errors
from .backoff import Backoff

log = logging.getLogger(__name__)

PAGE_SIZE = 500
PAGE_TIMEOUT_S = 60  # one list page's request, whole


class Gone(errors.UnavailableError):
    """The resourceVersion is too old (410): list again."""


def lines_of(chunks: Iterator[bytes]) -> Iterator[bytes]:
    """Complete non-empty lines of a chunked byte stream (each chunk split once: a chunk of many events
    costs its own length, not its length times its lines)."""
    rest = b""
    for chunk in chunks:
        parts = (rest + chunk).split(b"\n") if rest else chunk.split(b"\n")
        rest = parts.pop()
        for line in parts:
            if line.strip():
                yield line


class _Prefetch:
    """One page requested in a thread of its own; result() waits for it (bounded: the request has a timeout of
    PAGE_TIMEOUT_S) and raises what the request raised."""

    def __init__(self, fetch: Callable[[str], dict[str, Any]], token: str) -> None:
        self._fetch, self._token = fetch, token
        self._page: dict[str, Any] | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="informer-page", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._page = self._fetch(self._token)
        except BaseException as exc:  # noqa: BLE001 - handed to the informer's thread by result()
            self._error = exc

    def result(self) -> dict[str, Any]:
        self._thread.join(PAGE_TIMEOUT_S * 2)
        if self._thread.is_alive():
            raise TimeoutError(f"a list page did not arrive within {PAGE_TIMEOUT_S * 2} s")
        if self._error is not None:
            raise self._error
        assert self._page is not None
        return self._page


class Informer:
    def __init__(self, kind: str, list_fn: Callable[..., Any], *,
                 on_replace: Callable[[list[Any], int], None],
                 on_upsert: Callable[[dict[str, Any]], None],
                 on_delete: Callable[[dict[str, Any]], None],
                 synced: threading.Event, stop: threading.Event,
                 field_selector: str | None = None, watch_timeout: int = 300,
                 on_restart: Callable[[str, str], None] | None = None,
                 convert: Callable[[dict[str, Any]], Any] = lambda obj: obj,
                 backoff: Backoff | None = None, page_size: int = PAGE_SIZE) -> None:
        self.kind = kind
        self.list_fn = list_fn
        self.on_replace, self.on_upsert, self.on_delete = on_replace, on_upsert, on_delete
        self.synced = synced
        self.stop_event = stop
        self.field_selector = field_selector
        self.watch_timeout = watch_timeout
        self.on_restart = on_restart or (lambda kind, reason: None)
        self.convert = convert  # applied to listed items page by page (keeps relists small)
        self.backoff = backoff or Backoff()
        self.page_size = page_size
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

    def _page(self, token: str | None) -> dict[str, Any]:
        kwargs = self._kwargs() | {"limit": self.page_size, "_preload_content": False,
                                   "_request_timeout": PAGE_TIMEOUT_S}
        if token:
            kwargs["_continue"] = token
        resp = self.list_fn(**kwargs)
        try:
            return orjson.loads(resp.data)  # type: ignore[no-any-return]
        finally:
            resp.release_conn()

    def relist(self) -> None:
        """List every page; the next page is requested (and decoded) in a helper thread while this one's items
        are converted, so the API server's time to serve a page overlaps the extender's time to convert one."""
        items: list[Any] = []
        rv = ""
        page = self._page(None)
        while True:
            meta = page.get("metadata") or {}
            rv = rv or meta.get("resourceVersion") or ""
            token = meta.get("continue")
            ahead = _Prefetch(self._page, token) if token else None
            items.extend(self.convert(obj) for obj in page.get("items") or [])
            del page
            if ahead is None:
                break
            page = ahead.result()
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
            for line in lines_of(resp.stream(amt=None, decode_content=False)):
                self._event(orjson.loads(line))
                self.backoff.reset()  # the API server answers again
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
        if rv:  # BOOKMARK events only move the resourceVersion on
            self.resource_version = rv

    def run(self) -> None:
        need_list = True
        while not self.stop_event.is_set():
            try:
                if need_list:
                    self.relist()
                    need_list = False
                    self.backoff.reset()
                self.watch_once()
            except Exception as exc:  # noqa: BLE001 - connection drops, bad JSON: retry, never die
                if self.stop_event.is_set():
                    break
                need_list = need_list or self._failed(exc)

    def _failed(self, exc: Exception) -> bool:
        """Handle a failed list or watch; True when the next attempt must list again."""
        from kubernetes.client.exceptions import ApiException

        if isinstance(exc, Gone) or (isinstance(exc, ApiException) and exc.status == 410):
            log.info("%s watch: resourceVersion %s expired (410 Gone); listing again", self.kind,
                     self.resource_version)
            self.on_restart(self.kind, "gone")
            return True
        why = f"{exc.status} {exc.reason}" if isinstance(exc, ApiException) else f"{type(exc).__name__}: {exc}"
        self.on_restart(self.kind, "error")
        delay = self.backoff.wait(self.stop_event)
        log.warning("%s list/watch failed (%s); retried after %.2f s (failure %d in a row)", self.kind, why, delay,
                    self.backoff.failures)
        return False
