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
// cmd/kube-controller-manager/app/resource.go wires it, until SIGTERM/SIGINT.
func runResourceClaimController(args []string) int {
	fs := flag.NewFlagSet("resourceclaim-controller", flag.ContinueOnError)
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig of the controller's identity")
	workers := fs.Int("workers", 10, "concurrent syncs (kube-controller-manager's default is 10)")
	if err := fs.Parse(args); err != nil || *kubeconfig == "" {
		fmt.Fprintln(os.Stderr, "kubecluster resourceclaim-controller: --kubeconfig FILE is required")
		return 2
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		fmt.Fprintln(os.Stderr, "kubecluster resourceclaim-controller:", err)
		return 1
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "kubecluster resourceclaim-controller:", err)
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	factory := informers.NewSharedInformerFactory(client, 12*time.Hour)
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
