"""DRA mode: the kubelet's DRAPlugin service, registration, ResourceSlice, claim preparation, CDI, checkpoint."""
