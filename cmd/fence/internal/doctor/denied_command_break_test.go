package doctor_test

import (
	"context"
	"strings"
	"testing"

	"github.com/fencekit/fence/cmd/fence/internal/doctor"
	"github.com/fencekit/fence/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// TestDeniedCommandNamed: the INFO probe runs INFO inside an EVAL, so an
// ACL user denied EVAL alone got EVAL's NOPERM from it too, and the doctor
// blamed INFO: "may not run EVAL, INFO on fence's keys", fix "ACL SETUSER
// <user> +eval +info …", for a user who may run INFO. The finding names the
// command the NOPERM text names; a user denied INFO alone is still told
// about INFO, and only INFO.
func TestDeniedCommandNamed(t *testing.T) {
	s := redistest.Start(t, durable...)
	admin := s.Client(t)
	ctx := context.Background()
	for _, rule := range [][]any{
		{"ACL", "SETUSER", "noeval", "on", ">pw", "~*", "&*", "+@all", "-eval"},
		{"ACL", "SETUSER", "noinfo", "on", ">pw", "~*", "&*", "+@all", "-info"},
	} {
		if err := admin.Do(ctx, rule...).Err(); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct{ user, cmd, other string }{
		{"noeval", "EVAL", "INFO"},
		{"noinfo", "INFO", "EVAL"},
	} {
		cfg := doctor.Config{Standalone: &redis.Options{Addr: s.Addr, Username: c.user, Password: "pw"}}
		f := has(t, run(t, cfg), "command-denied", doctor.Critical, s.Addr)
		if !strings.Contains(f.Why, "may not run "+c.cmd+" on fence") || strings.Contains(f.Fix, "+"+strings.ToLower(c.other)) {
			t.Errorf("user %s, denied %s only: Why %q, Fix %q", c.user, c.cmd, f.Why, f.Fix)
		}
	}
}

// TestDeniedCommandInsideProbeScript: a user allowed EVAL but denied a
// command that the EVAL probe's script runs (EXISTS), and denied ACL
// DRYRUN, so that only the probe can tell. Redis refuses the inner call
// with "ERR The user executing the script can't run this command or
// subcommand script: …, on @user_script:2.", which names no command, and
// the doctor blamed the probe's own: "may not run EVAL", fix "ACL SETUSER
// <user> +eval …", which the user has, and which changes nothing. The
// finding names the command of the script's line that was refused.
func TestDeniedCommandInsideProbeScript(t *testing.T) {
	s := redistest.Start(t, durable...)
	admin := s.Client(t)
	ctx := context.Background()
	if err := admin.Do(ctx, "ACL", "SETUSER", "u", "on", ">pw", "~*", "&*", "+@all", "-acl|dryrun", "-exists").Err(); err != nil {
		t.Fatal(err)
	}
	cfg := doctor.Config{Standalone: &redis.Options{Addr: s.Addr, Username: "u", Password: "pw"}}
	f := has(t, run(t, cfg), "command-denied", doctor.Critical, s.Addr)
	if !strings.Contains(f.Why, "may not run EXISTS on fence") || !strings.Contains(f.Fix, "+exists") || strings.Contains(f.Fix, "+eval") {
		t.Errorf("user allowed EVAL, denied EXISTS and ACL DRYRUN: Why %q, Fix %q; want EXISTS named, not EVAL", f.Why, f.Fix)
	}
}
