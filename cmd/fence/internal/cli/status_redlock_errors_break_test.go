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

// TestStatusRedlockTLSFailureAnswered: a node whose TLS handshake failed
// (its certificate signed by a CA fence does not trust) was labelled
// "answered, not read", which says nothing of where to look; it answered,
// so it is reached, and its line now names the TLS handshake. A plain
// server behind rediss:// never answers the TLS client's hello: it was
// labelled "answered, not read" too (redlock's "no reply in time"), and is
// now unreachable, as a node that did not answer. Each node of --json
// says whether it was reached and read: a script had only the totals.
func TestStatusRedlockTLSFailureAnswered(t *testing.T) {
	t.Parallel()
	plain, plain2 := redistest.Start(t), redistest.Start(t)
	untrusted := redistest.StartTLS(t, redistest.NewTLS(t))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().String()
	ln.Close()
	urls := strings.Join([]string{redisURL(plain), "rediss://" + untrusted.Addr, "rediss://" + plain2.Addr, "redis://" + closed}, ",")
	out, errOut, code := fence(t, nil, "status", "--redlock", urls, "job")
	t.Logf("status --redlock: exit %d\n%s%s", code, out, errOut)
	lines := strings.Split(out, "\n")
	if code != 2 || len(lines) < 5 || !strings.Contains(lines[0], "2 reached, 1 read") {
		t.Fatalf("status --redlock: exit %d, stdout %q, stderr %q; want exit 2, 2 reached, 1 read", code, out, errOut)
	}
	for i, want := range []string{"free", "TLS handshake failed", "unreachable: node 2: no reply in time", "unreachable"} {
		if !strings.Contains(lines[i+1], want) {
			t.Errorf("node %d's line %q does not say %q", i, lines[i+1], want)
		}
	}
	out, errOut, code = fence(t, nil, "status", "--json", "--redlock", urls, "job")
	var r struct {
		Nodes []struct {
			Reached bool `json:"reached"`
			Read    bool `json:"read"`
		} `json:"nodes"`
	}
	if err := json.Unmarshal([]byte(out), &r); err != nil || len(r.Nodes) != 4 || code != 2 {
		t.Fatalf("status --json --redlock: exit %d, stdout %q (%v), stderr %q", code, out, err, errOut)
	}
	for i, want := range [][2]bool{{true, true}, {true, false}, {false, false}, {false, false}} {
		if got := [2]bool{r.Nodes[i].Reached, r.Nodes[i].Read}; got != want {
			t.Errorf("node %d: reached, read = %v, want %v; stdout %s", i, got, want, out)
		}
	}
}

// TestStatusRedlockClientCertRefusedAnswered: a node that asks for a
// client certificate (--tls-auth-clients yes) and was sent none refuses
// the handshake with a TLS alert, which crypto/tls returns as a
// *net.OpError ("remote error: tls: certificate required"): it answered,
// yet it was labelled "unreachable" and not counted reached, since any
// net.Error was taken for no answer before the TLS failure was looked
// for.
func TestStatusRedlockClientCertRefusedAnswered(t *testing.T) {
	t.Parallel()
	ca := redistest.NewTLS(t)
	open := redistest.StartTLS(t, ca)
	mutual := redistest.StartTLS(t, ca, "--tls-auth-clients", "yes")
	urls := "rediss://" + open.Addr + ",rediss://" + mutual.Addr
	out, errOut, code := fence(t, nil, "status", "--redlock", urls, "--redis-tls-ca", ca.CAFile, "job")
	t.Logf("status --redlock: exit %d\n%s%s", code, out, errOut)
	lines := strings.Split(out, "\n")
	if len(lines) < 3 || !strings.Contains(lines[0], "2 reached, 1 read") {
		t.Fatalf("status --redlock: exit %d, stdout %q, stderr %q; want 2 reached, 1 read", code, out, errOut)
	}
	if !strings.Contains(lines[2], "TLS handshake failed") || strings.Contains(lines[2], "unreachable") {
		t.Errorf("the node that refused the certificate-less client: %q, want a TLS handshake failure, not unreachable", lines[2])
	}
}
