"""What fits where: the cluster picture (state, views, records), pod requests, the pure decisions."""
