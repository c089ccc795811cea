"""DRA: the CDI spec of a prepared claim (one file per claim in --cdi-dir, /var/run/cdi by default).

The container edits are what the device plugin's Allocate answers (plugin/response.py `container_edits`, before
Allocate wraps it in its protobuf), translated field by field, so both modes hand a container the same env,
mounts and GPU visibility, and whatever Allocate gains later reaches DRA containers too. A CDI device ID that
Allocate returns (--visibility cdi: the NVIDIA CDI device of each GPU) is returned beside memslice's own.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..response import Edits
from .prepare import DRIVER

# The lowest version the spec's features need (the CDI library refuses a spec declaring less): 0.5.0 lets a
# device name start with a digit (claim UIDs do) and a deviceNode carry hostPath; annotations would need 0.6.0.
CDI_VERSION = "0.5.0"
CDI_KIND = f"{DRIVER}/gpu-mem"
SPEC_PREFIX = f"{DRIVER}-"
_CDI_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}\Z")


@dataclass(frozen=True)
class CdiDevice:
    name: str
    edits: Edits

    def qualified(self) -> str:
        return f"{CDI_KIND}={self.name}"


def cdi_device_name(claim_uid: str, share_id: str) -> str:
    name = f"{claim_uid}-{share_id}"
    if not _CDI_NAME.match(name):
        raise ValueError(f"CDI device name {name!r} is not valid")
    return name


def container_edits(e: Edits) -> dict[str, Any]:
    """Allocate's env/mounts as CDI containerEdits."""
    edits: dict[str, Any] = {"env": [f"{k}={v}" for k, v in sorted(e.envs.items())]}
    if e.mounts:
        edits["mounts"] = [{"hostPath": m.host_path, "containerPath": m.container_path,
                            "options": ["ro" if m.read_only else "rw", "nosuid", "nodev", "bind"]}
                           for m in e.mounts]
    return edits


def spec_document(devices: Iterable[CdiDevice]) -> dict[str, Any]:
    # No spec or device annotations: they need cdiVersion 0.6.0, and the claim UID is in the file name.
    return {"cdiVersion": CDI_VERSION, "kind": CDI_KIND,
            "devices": [{"name": d.name, "containerEdits": container_edits(d.edits)} for d in devices]}


def extra_device_ids(devices: Iterable[CdiDevice]) -> list[str]:
    """CDI devices Allocate asks the runtime for (the GPU itself with --visibility cdi)."""
    out: list[str] = []
    for d in devices:
        out.extend(c for c in d.edits.cdi_devices if c not in out)
    return out


class CdiSpecs:
    """The spec files this driver owns in `cdi_dir`: `memslice.io-<claim uid>.json`."""

    def __init__(self, cdi_dir: Path) -> None:
        self.dir = cdi_dir

    def prepare(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)

    def path_of(self, claim_uid: str) -> Path:
        if not _CDI_NAME.match(claim_uid):
            raise ValueError(f"claim uid {claim_uid!r} cannot name a CDI spec file")
        return self.dir / f"{SPEC_PREFIX}{claim_uid}.json"

    def write(self, claim_uid: str, devices: list[CdiDevice]) -> Path:
        """Atomically (the runtime may read the directory at any time), without fsync: the agent rewrites
        every spec from its checkpoint at start-up, so a spec lost or torn by a crash of the node is repaired
        before the kubelet can ask for it again."""
        path = self.path_of(claim_uid)
        fd, tmp = tempfile.mkstemp(dir=self.dir, prefix=f".{path.name}.")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(spec_document(devices), f, indent=1)
            os.chmod(tmp, 0o644)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return path

    def remove(self, claim_uid: str) -> None:
        self.path_of(claim_uid).unlink(missing_ok=True)

    def claim_uids(self) -> list[str]:
        """UIDs of the claims with a spec file here (for sweeping what no checkpoint entry holds)."""
        out = []
        for p in self.dir.glob(f"{SPEC_PREFIX}*.json"):
            uid = p.name[len(SPEC_PREFIX):-len(".json")]
            if _CDI_NAME.match(uid) and not p.name.startswith("."):
                out.append(uid)
        return sorted(out)

