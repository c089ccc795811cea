// kubenode: the real kubelet, built from k8s.io/kubernetes (the same module version as tests/kubecluster), for
// memslice's real-node tests (tests/support/kube_node.py). It is cmd/kubelet's main, nothing added:
//
//	kubenode [kubelet flags...]
//
// containerd, its runc shim and ctr are built from containerd's own module by build.sh beside this file.
package main

import (
	"context"
	"os"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"          // the kubelet's JSON log format
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // client metrics, as cmd/kubelet registers them
	_ "k8s.io/component-base/metrics/prometheus/version"  // the version metric, as cmd/kubelet registers it
	"k8s.io/kubernetes/cmd/kubelet/app"
)

func main() {
	os.Exit(cli.Run(app.NewKubeletCommand(context.Background())))
}
