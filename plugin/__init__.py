"""The node agent: its entry (agent, cli, config) and what both kubelet APIs share (state, ledger, regions, ...)."""
