package main

import (
	"fmt"
	"net/url"
	"os"
	"strconv"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"k8s.io/component-base/cli"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
)

// runAPIServer starts an embedded single-member etcd on loopback, waits (bounded) until it serves, then
// runs the real kube-apiserver against it with the remaining flags; the process ends with either.
func runAPIServer(args []string) int {
	if len(args) < 3 {
		usage()
	}
	etcd, err := startEtcd(args[0], args[1], args[2])
	if err != nil {
		fmt.Fprintln(os.Stderr, "kubecluster: etcd:", err)
		return 1
	}
	defer etcd.Close()
	go func() {
		// etcd failing under a running apiserver ends the process: a test sees it exit, not hang.
		if err := <-etcd.Err(); err != nil {
			fmt.Fprintln(os.Stderr, "kubecluster: etcd failed:", err)
			os.Exit(1)
		}
	}()
	cmd := apiserver.NewAPIServerCommand()
	cmd.SetArgs(append([]string{"--etcd-servers=http://127.0.0.1:" + args[1]}, args[3:]...))
	return cli.Run(cmd)
}

// startEtcd configures etcd for a test: one member, loopback only, its data in dir, quiet logs.
func startEtcd(dir, clientPort, peerPort string) (*embed.Etcd, error) {
	for _, p := range []string{clientPort, peerPort} {
		if n, err := strconv.Atoi(p); err != nil || n <= 0 || n > 65535 {
			return nil, fmt.Errorf("port %q is not a TCP port number", p)
		}
	}
	cfg := embed.NewConfig()
	cfg.Dir = dir
	cfg.Name = "memslice-test"
	cfg.LogLevel = "error"
	client := url.URL{Scheme: "http", Host: "127.0.0.1:" + clientPort}
	peer := url.URL{Scheme: "http", Host: "127.0.0.1:" + peerPort}
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{client}, []url.URL{client}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{peer}, []url.URL{peer}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, err
	}
	select {
	case <-e.Server.ReadyNotify():
		return e, nil
	case <-time.After(60 * time.Second):
		e.Close()
		return nil, fmt.Errorf("not ready within 60 s (data dir %s)", dir)
	}
}
