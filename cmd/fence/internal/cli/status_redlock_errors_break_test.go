package cli_test

import (
	"context"
	"encoding/json"
	"net"
	"strings"
	"testing"

	"github.com/fencekit/fence/internal/redistest"
)

// TestStatusRedlockNamesWhatEachNodeAnswered: fence status --redlock
// called every node it could not read "unreachable", also those that
// answered: the line of a replica's URL read "unreachable: READONLY …",
// of an ACL user without EVAL "unreachable: NOPERM …", of a wrong password
// "unreachable: WRONGPASS …", which sends the operator looking at the
// network, and "4 reached" was "1 reached". Now a node that answered an
// error is reached (the replica's line says so) and only the closed port is
// unreachable; the exit code still counts the nodes read (1 of quorum 3).
func TestStatusRedlockNamesWhatEachNodeAnswered(t *testing.T) {
	t.Parallel()
	primary := redistest.Start(t)
	replica := redistest.StartReplica(t, primary)
	redistest.WaitReplicated(t, primary, 1)
	noEval := redistest.Start(t)
	if err := noEval.Client(t).Do(context.Background(), "ACL", "SETUSER", "u", "on", ">pw", "~*", "&*", "+@all", "-eval").Err(); err != nil {
		t.Fatal(err)
	}
	locked := redistest.Start(t) // knows no user u: WRONGPASS
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().String()
	ln.Close() // nothing listens there: connections are refused
	urls := strings.Join([]string{
		redisURL(primary),
		redisURL(replica),
		"redis://u:pw@" + noEval.Addr,
		"redis://u:wrong@" + locked.Addr,
		"redis://" + closed,
	}, ",")
	out, errOut, code := fence(t, nil, "status", "--redlock", urls, "job")
	t.Logf("status --redlock: exit %d\n%s%s", code, out, errOut)
	lines := strings.Split(out, "\n")
	if code != 2 || len(lines) < 6 || !strings.Contains(lines[0], "4 reached, 1 read") {
		t.Fatalf("status --redlock: exit %d, stdout %q, stderr %q; want exit 2, 4 reached, 1 read", code, out, errOut)
	}
	for i, want := range []string{"free", "replica", "NOPERM", "WRONGPASS", "unreachable"} {
		if !strings.Contains(lines[i+1], want) {
			t.Errorf("node %d's line %q does not say %q", i, lines[i+1], want)
		}
		if i < 4 && strings.Contains(lines[i+1], "unreachable") {
			t.Errorf("node %d answered, but its line says unreachable: %q", i, lines[i+1])
		}
	}
	out, errOut, code = fence(t, nil, "status", "--json", "--redlock", urls, "job")
	var r struct {
		Reached int `json:"reached"`
		Read    int `json:"read"`
		Quorum  int `json:"quorum"`
	}
	if err := json.Unmarshal([]byte(out), &r); err != nil || r.Reached != 4 || r.Read != 1 || r.Quorum != 3 || code != 2 {
		t.Errorf("status --json --redlock: exit %d, stdout %q (%v), stderr %q; want exit 2, reached 4, read 1 of quorum 3", code, out, err, errOut)
	}
}
