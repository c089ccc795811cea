"""Kubernetes plumbing shared by the node agent and the scheduler extender: one informer (paged list,
watch, 410 relist, bookmarks), one backoff policy, and one way to find the API server (config.py)."""
