package main

import (
	"cmp"
	"errors"
	"flag"
	"fmt"

	"go.etcd.io/etcd/etcdutl/v3/snapshot"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// restore runs "etcdmain restore [-bump-revision N -mark-compacted]
// [-data-dir DIR] SNAPSHOT CONFIG.yaml": it makes the data dir named in
// CONFIG, or DIR (which must not exist, or be empty), from SNAPSHOT, for
// the member CONFIG describes, with etcdutl's own code, as
//
//	etcdutl snapshot restore SNAPSHOT --name NAME --data-dir DIR \
//		--initial-cluster ... --initial-cluster-token ... \
//		--initial-advertise-peer-urls ... [--bump-revision N --mark-compacted]
//
// does. Each member of a cluster is restored from the same snapshot.
func restore(args []string) error {
	fs := flag.NewFlagSet("etcdmain restore", flag.ContinueOnError)
	bump := fs.Uint64("bump-revision", 0, "how much to increase the latest revision after the restore")
	compacted := fs.Bool("mark-compacted", false, "mark the latest revision after the restore as compacted (required with -bump-revision)")
	// So that a member can be restored beside its data dir, which it goes
	// on serving until the restore has succeeded.
	dataDir := fs.String("data-dir", "", "the data dir to make (default: CONFIG's)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 2 {
		return errors.New("usage: " + restoreUsage)
	}
	// etcdutl refuses one without the other; its snapshot package bumps
	// nothing, and says nothing, given a bump without -mark-compacted.
	if (*bump > 0) != *compacted {
		return errors.New("-mark-compacted is required with -bump-revision > 0, and refused without it")
	}
	cfg, err := embed.ConfigFromFile(fs.Arg(1))
	if err != nil {
		return fmt.Errorf("config: %w", err)
	}
	var peers []string
	for _, u := range cfg.AdvertisePeerUrls {
		peers = append(peers, u.String())
	}
	lg, err := zap.NewProduction()
	if err != nil {
		return err
	}
	return snapshot.NewV3(lg).Restore(snapshot.RestoreConfig{
		SnapshotPath:        fs.Arg(0),
		Name:                cfg.Name,
		OutputDataDir:       cmp.Or(*dataDir, cfg.Dir),
		PeerURLs:            peers,
		InitialCluster:      cfg.InitialCluster,
		InitialClusterToken: cfg.InitialClusterToken,
		RevisionBump:        *bump,
		MarkCompacted:       *compacted,
	})
}
