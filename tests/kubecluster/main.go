// kubecluster: the real Kubernetes control-plane components, built from k8s.io/kubernetes, in one binary
// (one build of the shared code) for memslice's tests. Each subcommand runs one component as a process:
//
//	kubecluster apiserver <etcd-data-dir> <etcd-client-port> <etcd-peer-port> [kube-apiserver flags...]
//	    embedded etcd (go.etcd.io/etcd/server/v3/embed) on loopback, then kube-apiserver in the same process
//	kubecluster scheduler [kube-scheduler flags...]
//	kubecluster resourceclaim-controller --kubeconfig FILE
//	    the kube-controller-manager's resourceclaim controller, alone
package main

import (
	"fmt"
	"os"
)

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	sub, args := os.Args[1], os.Args[2:]
	var code int
	switch sub {
	case "apiserver":
		code = runAPIServer(args)
	case "scheduler":
		code = runScheduler(args)
	case "resourceclaim-controller":
		code = runResourceClaimController(args)
	default:
		usage()
	}
	os.Exit(code)
}

// usage names the subcommands: a wrong invocation is a test-harness bug, said plainly.
func usage() {
	fmt.Fprintln(os.Stderr, "usage: kubecluster apiserver <etcd-dir> <etcd-client-port> <etcd-peer-port> [kube-apiserver flags]")
	fmt.Fprintln(os.Stderr, "       kubecluster scheduler [kube-scheduler flags]")
	fmt.Fprintln(os.Stderr, "       kubecluster resourceclaim-controller --kubeconfig FILE")
	os.Exit(2)
}
