"""Names shared with the node agent and users (docs/architecture.md, "Contracts")."""

from __future__ import annotations

RESOURCE = "memslice.io/gpu-mem"

# node annotations, written by the node agent
ANN_GPUS = "memslice.io/gpus"
ANN_UNIT_MIB = "memslice.io/unit-mib"

# pod annotations, written by the extender at bind
ANN_GPU_UUID = "memslice.io/gpu-uuid"
ANN_GPU_MEM = "memslice.io/gpu-mem-mib"
ANN_ASSUMED_AT = "memslice.io/assumed-at"
RESERVATION_ANNOTATIONS = (ANN_GPU_UUID, ANN_GPU_MEM, ANN_ASSUMED_AT)

# pod annotation, set by users
ANN_POLICY = "memslice.io/policy"
POLICIES = ("binpack", "spread")

# extender priority range (k8s.io/kube-scheduler/extender/v1)
MIN_SCORE = 0
MAX_SCORE = 10
