"""Fast filter and prioritize: the verdict memo (fitmemo) and the node-name index (nameids, _nameids.c)."""
