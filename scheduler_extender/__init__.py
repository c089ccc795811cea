"""memslice scheduler extender: a pod's GPU-memory slice must fit on one GPU (see docs/architecture.md)."""
