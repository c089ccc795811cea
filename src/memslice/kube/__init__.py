"""Kubernetes plumbing shared by the node agent and the scheduler extender: one informer (paged list,
watch, 410 relist, bookmarks) and one backoff policy."""
