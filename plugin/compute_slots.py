"""Compute slots of a container or claim on one GPU or several, for both kubelet APIs.

The limits file names ONE compute slot (`compute_slot`), which the shim opens on the board of every device it
uses, so a container spanning GPUs needs a slot number free on every one of its GPUs' rosters. `common_slot`
decides it (pure); `provision_all` provisions it on each GPU (memslice.compute.provision, which refuses a sum
of requests over 100 and a slot taken meanwhile) and undoes what it did when one GPU refuses.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping, Sequence

from memslice.compute import SLOTS, ComputeShareError, RosterEntry, Share, provision, read_roster, release

log = logging.getLogger(__name__)


def common_slot(rosters: Iterable[Mapping[int, RosterEntry]]) -> int:
    """The lowest slot no roster assigns (pure); ComputeShareError when none is free on all of them."""
    taken: set[int] = set()
    for roster in rosters:
        taken.update(roster)
    for slot in range(SLOTS):
        if slot not in taken:
            return slot
    raise ComputeShareError(f"no compute slot is free on every GPU of the container ({len(taken)} of {SLOTS} "
                            f"are assigned on one of them); release one first")


def provision_all(compute_dir: str | os.PathLike[str], uuids: Sequence[str], share: Share, priority: int = 0
                  ) -> int:
    """Provision `share` on every GPU of `uuids` under ONE slot number; the slot. ComputeShareError (nothing
    left provisioned) when a GPU's requests would sum over 100 or no slot is free on all of them. A slot taken
    by another provisioner between the read and the write is retried once with the next free one."""
    for attempt in range(2):
        slot = common_slot(read_roster(compute_dir, u) or {} for u in uuids)
        done: list[str] = []
        try:
            for uuid in uuids:
                provision(compute_dir, uuid, share, priority, slot=slot)
                done.append(uuid)
            return slot
        except ComputeShareError:
            release_all(compute_dir, done, slot)
            raced = any(slot in (read_roster(compute_dir, u) or {}) for u in uuids)
            if attempt or not raced:
                raise
    raise AssertionError("unreachable: the second attempt returns or raises")


def release_all(compute_dir: str | os.PathLike[str], uuids: Iterable[str], slot: int) -> None:
    """Release `slot` on every GPU of `uuids`; a GPU whose release fails is logged and skipped."""
    for uuid in uuids:
        try:
            release(compute_dir, uuid, slot)
        except (OSError, ComputeShareError) as exc:
            log.warning("cannot release compute slot %d of GPU %s: %s", slot, uuid, exc)
