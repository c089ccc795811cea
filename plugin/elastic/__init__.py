"""Elastic GPU memory on the node: board slots and roster, per-GPU/per-container figures, swap Events."""
