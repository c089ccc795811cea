"""Device-plugin mode: the kubelet's DevicePlugin service, its registration, PodResources, the node inventory."""
