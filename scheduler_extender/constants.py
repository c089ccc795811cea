"""Names shared with the node agent and users (docs/architecture.md, "Contracts")."""

from __future__ import annotations

from memslice.elastic import ANN_LIMIT_RECORD

RESOURCE = "memslice.io/gpu-mem"

# node annotations, written by the node agent
ANN_GPUS = "memslice.io/gpus"
ANN_UNIT_MIB = "memslice.io/unit-mib"

# pod annotations, written by the extender at bind
ANN_GPU_UUID = "memslice.io/gpu-uuid"
ANN_GPU_MEM = "memslice.io/gpu-mem-mib"
ANN_ASSUMED_AT = "memslice.io/assumed-at"
RESERVATION_ANNOTATIONS = (ANN_GPU_UUID, ANN_GPU_MEM, ANN_ASSUMED_AT)
# elastic memory: the limits recorded at bind, only when a container's limit is above its request (the names
# and parsers both sides use are in memslice.elastic)
ANN_GPU_MEM_LIMIT_RECORD = ANN_LIMIT_RECORD

# pod annotation, set by users
ANN_POLICY = "memslice.io/policy"
POLICIES = ("binpack", "spread")

# extender priority range (k8s.io/kube-scheduler/extender/v1)
MIN_SCORE = 0
MAX_SCORE = 10
