package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/controller/resourceclaim"
)

// runResourceClaimController runs the kube-controller-manager's resourceclaim controller alone (the one
// a DRA cluster needs: claims from a pod's ResourceClaimTemplates, status.reservedFor cleanup), wired as
// cmd/kube-controller-manager/app/resource.go wires it, until SIGTERM/SIGINT. As kube-controller-manager
// with --use-service-account-credentials: the shared informers read with the manager's own identity
// (--informer-kubeconfig), the controller writes with its ServiceAccount's (--kubeconfig).
func runResourceClaimController(args []string) int {
	fs := flag.NewFlagSet("resourceclaim-controller", flag.ContinueOnError)
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig of the controller's identity")
	informerKubeconfig := fs.String("informer-kubeconfig", "", "kubeconfig of the shared informers (default: --kubeconfig)")
	workers := fs.Int("workers", 10, "concurrent syncs (kube-controller-manager's default is 10)")
	if err := fs.Parse(args); err != nil || *kubeconfig == "" {
		fmt.Fprintln(os.Stderr, "kubecluster resourceclaim-controller: --kubeconfig FILE is required")
		return 2
	}
	if *informerKubeconfig == "" {
		*informerKubeconfig = *kubeconfig
	}
	client, err := clientFor(*kubeconfig)
	if err != nil {
		fmt.Fprintln(os.Stderr, "kubecluster resourceclaim-controller:", err)
		return 1
	}
	informerClient, err := clientFor(*informerKubeconfig)
	if err != nil {
		fmt.Fprintln(os.Stderr, "kubecluster resourceclaim-controller:", err)
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	factory := informers.NewSharedInformerFactory(informerClient, 12*time.Hour)
	ctrl, err := resourceclaim.NewController(klog.FromContext(ctx), client,
		factory.Core().V1().Pods(),
		factory.Scheduling().V1beta1().PodGroups(),
		factory.Resource().V1().ResourceClaims(),
		factory.Resource().V1().ResourceClaimTemplates())
	if err != nil {
		fmt.Fprintln(os.Stderr, "kubecluster resourceclaim-controller:", err)
		return 1
	}
	factory.Start(ctx.Done())
	ctrl.Run(ctx, *workers)
	return 0
}

// clientFor is a clientset for one kubeconfig file.
func clientFor(kubeconfig string) (*kubernetes.Clientset, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, err
	}
	return kubernetes.NewForConfig(cfg)
}
