package zkserver

import (
	"errors"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The port check of commit a3ed942 tried again (branch break-today).

// foreignOn starts another test's standalone server on addr, in a temp
// dir of its own, with edit applied to its zoo.cfg, and waits until it
// serves.
func foreignOn(t *testing.T, addr, java string, edit func(cfg string) string) *Server {
	t.Helper()
	f := &Server{Addr: addr, java: java, Dir: t.TempDir()}
	if err := f.writeConfig(nil, nil); err != nil {
		t.Fatal(err)
	}
	if edit != nil {
		b, err := os.ReadFile(f.cfgPath())
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(f.cfgPath(), []byte(edit(string(b))), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.launch(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.Kill)
	deadline := time.Now().Add(readyTimeout)
	for {
		if mode, err := f.Mode(); err == nil && mode != "" {
			return f
		}
		if time.Now().After(deadline) {
			t.Fatalf("the other server on %s does not serve", addr)
		}
		<-time.After(20 * time.Millisecond)
	}
}

// TestRestartOnTakenPort: a standalone server is killed, another test's
// server takes its port, and the first is restarted (Restart keeps the
// port): Restart must fail with errPortTaken and leave the other running.
func TestRestartOnTakenPort(t *testing.T) {
	s, err := Start("")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	s.Kill()
	other := foreignOn(t, s.Addr, s.java, nil)
	began := time.Now()
	err = s.Restart()
	t.Logf("Restart after %v: %.300v", time.Since(began), err)
	if !errors.Is(err, errPortTaken) {
		t.Fatalf("Restart on a port another server took = %v, want errPortTaken", err)
	}
	if mode, err := other.Mode(); err != nil || mode != "standalone" {
		t.Errorf("the other server after the failed Restart: %q, %v", mode, err)
	}
}

// TestTakenByServerWithDefaultWhitelist: the server that took the port is
// a ZooKeeper with the default 4lw whitelist (srvr only: any ZooKeeper
// not started by this package). It answers srvr, so waitReady asks it for
// conf, which it refuses; checkOwn then fails with "conf names no
// dataDir", not errPortTaken, and start gives up at once instead of trying
// other ports, although this server failed to bind and exited.
func TestTakenByServerWithDefaultWhitelist(t *testing.T) {
	java, err := findJava()
	if err != nil {
		t.Fatal(err)
	}
	ports, err := freePorts(1)
	if err != nil {
		t.Fatal(err)
	}
	addr := "127.0.0.1:" + strconv.Itoa(ports[0])
	foreignOn(t, addr, java, func(cfg string) string {
		return strings.Replace(cfg, "4lw.commands.whitelist=*", "4lw.commands.whitelist=srvr", 1)
	})
	s := &Server{Addr: addr, java: java, Dir: t.TempDir()}
	if err := s.writeConfig(nil, nil); err != nil {
		t.Fatal(err)
	}
	if err := s.launch(); err != nil {
		t.Fatal(err)
	}
	defer s.Kill()
	err = s.waitReady(time.Now().Add(readyTimeout))
	t.Logf("waitReady: %.300v", err)
	if !errors.Is(err, errPortTaken) {
		t.Fatalf("waitReady on %s, where another ZooKeeper (whitelist srvr) serves = %v, want errPortTaken (start would try other ports)", addr, err)
	}
}
