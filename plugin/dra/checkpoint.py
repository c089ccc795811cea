"""DRA: the record of prepared claims, so that a restarted agent answers a repeated NodePrepareResources the
same way and can still NodeUnprepareResources what an earlier instance prepared.

One JSON file, `<kubelet plugins dir>/memslice.io/checkpoint.json`, rewritten atomically after every change.
It is written only by the agent (root on the host; no container mounts it); a file that cannot be read is
refused at start-up with the path and the fix, rather than guessed at.
"""

from __future__ import annotations

import functools
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from memslice import errors

from ..regions import _atomic_write
from .prepare import ClaimRef, Compute, Elastic, Grant, Share, grants

VERSION = 1


class CheckpointError(errors.UnavailableError):
    pass


@dataclass(frozen=True)
class PreparedClaim:
    ref: ClaimRef
    shares: tuple[Share, ...]
    cdi_ids: tuple[str, ...]  # every CDI device ID returned for the claim, memslice's first
    elastic: Elastic | None = None  # the claim's elastic memory (GpuMemConfig limit), slot and priority included
    spill: int | None = None  # GpuMemConfig oversubscribe: None off, -1 no cap, or the spill cap in bytes
    compute: Compute | None = None  # the claim's compute share, its slot included

    @functools.cached_property
    def grants(self) -> list[Grant]:
        """The claim's regions (one per claim; an older agent's record may group otherwise), built once."""
        return grants(self.shares)

    @functools.cached_property
    def json(self) -> dict[str, Any]:
        """The record's JSON form, built once (the whole checkpoint is rewritten on every change). `elastic` only
        when the claim is elastic, `spill` only when it oversubscribes: an agent of the version before reads the
        record (it ignores the keys)."""
        out: dict[str, Any] = {"namespace": self.ref.namespace, "name": self.ref.name, "uid": self.ref.uid,
                               "shares": [asdict(s) for s in self.shares], "cdiIDs": list(self.cdi_ids)}
        if self.elastic is not None:
            out["elastic"] = asdict(self.elastic)
        if self.spill is not None:
            out["spill"] = self.spill
        if self.compute is not None:
            out["compute"] = asdict(self.compute)
        return out

    @staticmethod
    def from_json(raw: dict[str, Any]) -> PreparedClaim:
        elastic, compute = raw.get("elastic"), raw.get("compute")
        spill = raw.get("spill")
        if spill is not None and (not isinstance(spill, int) or isinstance(spill, bool) or spill < -1):
            raise ValueError(f"claim {raw.get('uid')!r}: spill {spill!r} is not a byte count or -1")
        return PreparedClaim(ref=ClaimRef(namespace=str(raw["namespace"]), name=str(raw["name"]),
                                          uid=str(raw["uid"])),
                             shares=tuple(Share(**s) for s in raw["shares"]),
                             cdi_ids=tuple(str(c) for c in raw["cdiIDs"]),
                             elastic=None if elastic is None else Elastic(**elastic), spill=spill,
                             compute=None if compute is None else Compute(**compute))


class Checkpoint:
    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self) -> dict[str, PreparedClaim]:
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return {}
        except OSError as exc:
            raise CheckpointError(f"cannot read the DRA checkpoint {self.path}: {exc}") from exc
        try:
            raw = json.loads(text)
            if raw.get("version") != VERSION:
                raise ValueError(f"version {raw.get('version')!r}, expected {VERSION}")
            return {uid: PreparedClaim.from_json(c) for uid, c in raw["claims"].items()}
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise CheckpointError(f"the DRA checkpoint {self.path} cannot be read ({exc}): move it away; the "
                                  f"agent then starts empty and removes the regions and CDI specs no record "
                                  f"holds (pods using them must be re-created)") from exc

    def save(self, claims: dict[str, PreparedClaim]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        doc = {"version": VERSION, "claims": {uid: c.json for uid, c in sorted(claims.items())}}
        _atomic_write(self.path, json.dumps(doc).encode(), 0o600)
