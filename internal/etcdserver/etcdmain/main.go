// Command etcdmain runs one etcd member from a configuration file, with
// etcd's own server (go.etcd.io/etcd/server/v3/embed). It is the binary that
// internal/etcdserver builds and starts for fence's tests and lab; its
// module is separate so that the etcd server never enters another module's
// go.mod.
//
// Usage:
//
//	etcdmain CONFIG.yaml
//	etcdmain restore [-bump-revision N -mark-compacted] [-data-dir DIR] SNAPSHOT CONFIG.yaml
//
// The first runs the member. It exits when the server stops or fails, and
// on SIGTERM or SIGINT after closing the server. The second makes the
// member's data dir from a snapshot, as etcdutl snapshot restore does, and
// exits.
package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"go.etcd.io/etcd/server/v3/embed"
)

const (
	usage        = "etcdmain CONFIG.yaml"
	restoreUsage = "etcdmain restore [-bump-revision N -mark-compacted] [-data-dir DIR] SNAPSHOT CONFIG.yaml"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "restore" {
		if err := restore(os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, "etcdmain restore:", err)
			os.Exit(2)
		}
		return
	}
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: "+usage+"\n       "+restoreUsage)
		os.Exit(2)
	}
	cfg, err := embed.ConfigFromFile(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, "etcdmain: config:", err)
		os.Exit(2)
	}
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "etcdmain: start:", err)
		os.Exit(1)
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	select {
	case err := <-e.Err():
		fmt.Fprintln(os.Stderr, "etcdmain:", err)
		e.Close()
		os.Exit(1)
	case <-e.Server.StopNotify():
		fmt.Fprintln(os.Stderr, "etcdmain: server stopped")
		e.Close()
		os.Exit(1)
	case <-sig:
		e.Close()
	}
}
