"""The node's GPUs: discovery and memory use through NVML (nvml), health from Xid events (health)."""
