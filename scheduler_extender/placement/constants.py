"""The extender's own constants. The names shared with the node agent and users (resource, annotations,
policies) live in memslice.contract (docs/architecture.md, "Contracts")."""

from __future__ import annotations

# extender priority range (k8s.io/kube-scheduler/extender/v1)
MIN_SCORE = 0
MAX_SCORE = 10
