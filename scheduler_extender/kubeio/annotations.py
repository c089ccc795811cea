"""The extender's side of the annotation contract. The names, the typed Inventory and Reservation and their
parse/format live in memslice.contract, shared with the node agent (docs/architecture.md, "Contracts").

A malformed annotation is reported (errors.ContractError naming the object, the value and the fix) and then
treated as absent; it never crashes the extender.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

from memslice.contract import ComputeShare, Reservation
from memslice.elastic import ANN_LIMIT_RECORD


def reservation_annotations(gpu_uuid: str, container_mib: dict[str, int], assumed_at: float,
                            limits: dict[str, int] | None = None,
                            compute: tuple[ComputeShare, ...] = ()) -> dict[str, str]:
    """The pod annotations of a bind at `assumed_at` (Unix seconds); with `limits` (containers whose elastic
    limit is above their request), the limit record the node agent reads at Allocate; with `compute`, the
    containers' compute shares (contract.ANN_GPU_COMPUTE)."""
    out = Reservation(gpu_uuid, tuple(sorted(container_mib.items())),
                      datetime.fromtimestamp(assumed_at, UTC), compute).format()
    if limits:
        out[ANN_LIMIT_RECORD] = json.dumps(limits, sort_keys=True, separators=(",", ":"))
    return out
