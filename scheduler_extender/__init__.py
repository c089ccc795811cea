"""The scheduler extender: a pod's GPU-memory slice must fit on one GPU; app wires it, wire is its JSON format."""
