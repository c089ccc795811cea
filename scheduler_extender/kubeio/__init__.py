"""The extender's Kubernetes I/O: node and pod reads, the bind's writes, and the bind itself (binder)."""
