package main

import (
	"net/url"
	"strings"
	"testing"
	"time"
)

// -h and the errors of a bad URL show the defaults taken from the
// environment without their passwords.
func TestPasswordsHidden(t *testing.T) {
	env := map[string]string{
		"FENCE_REDIS_URL": "redis://u:hunter2@127.0.0.1:6379/0",
		"QUEUE_DB":        "postgres://app:hunter3@db.example/q?sslmode=disable&password=hunter4",
	}
	var help strings.Builder
	if _, err := parseFlags([]string{"-h"}, func(k string) string { return env[k] }, &help); err == nil {
		t.Fatal("-h did not stop")
	}
	if strings.Contains(help.String(), "hunter") || !strings.Contains(help.String(), "redis://u:xxxxx@127.0.0.1:6379/0") {
		t.Fatalf("-h shows a password, or no default:\n%s", help.String())
	}
	for _, bad := range []string{"redis://u:hunter2@[::1", "redis://u:hunter2@host:port"} {
		cfg, err := parseFlags([]string{"-redis", bad}, func(string) string { return "" }, &help)
		if err != nil {
			t.Fatal(err)
		}
		if err := run(cfg, ""); err == nil || strings.Contains(err.Error(), "hunter") {
			t.Fatalf("malformed URL %q: %v", bad, err)
		}
	}
}

// The idle-in-transaction timeout is added to the DSN unless it sets one;
// a DSN that is not a postgres:// URL is refused; QUEUED_TEST_STOP is
// checked.
func TestDSNAndStopSpec(t *testing.T) {
	got, err := withTimeouts("postgres://u@h/db?sslmode=disable", 2*time.Second, 1500*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if q := mustQuery(t, got); q.Get("idle_in_transaction_session_timeout") != "2000" || q.Get("connect_timeout") != "2" || q.Get("sslmode") != "disable" {
		t.Fatalf("withTimeouts: %s", got)
	}
	own := "postgres://u@h/db?connect_timeout=7&idle_in_transaction_session_timeout=0"
	if got, err := withTimeouts(own, time.Second, time.Second); err != nil || got != own {
		t.Fatalf("a DSN's own settings: %s, %v", got, err)
	}
	for _, bad := range []string{"host=h user=u", "mysql://h/db", "queue.db"} {
		if _, err := withTimeouts(bad, time.Second, time.Second); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	for _, bad := range []string{"before-fence", "before-fence:0", "after-commit:3", "before-commit:x"} {
		if _, err := stopHook(bad, nil); err == nil {
			t.Errorf("%s=%q accepted", StopEnv, bad)
		}
	}
	if h, err := stopHook("before-commit:3", nil); err != nil || h == nil {
		t.Fatalf("before-commit:3: %v", err)
	}
}

func mustQuery(t *testing.T, dsn string) url.Values {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	return u.Query()
}

// -idle-tx under a millisecond is refused: PostgreSQL's
// idle_in_transaction_session_timeout is whole milliseconds, and 500us
// went out as 0, which turns the timeout off. 1ms still goes.
func TestIdleTxUnderMillisecondRefused(t *testing.T) {
	none := func(string) string { return "" }
	if _, err := parseFlags([]string{"-idle-tx", "500us"}, none, &strings.Builder{}); err == nil {
		t.Fatal("-idle-tx 500us accepted")
	}
	cfg, err := parseFlags([]string{"-idle-tx", "1ms"}, none, &strings.Builder{})
	if err != nil || cfg.idleTx != time.Millisecond {
		t.Fatalf("-idle-tx 1ms: %v, %v", cfg.idleTx, err)
	}
}
