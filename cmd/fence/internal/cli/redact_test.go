package cli

import (
	"strings"
	"testing"
)

func TestRedactURL(t *testing.T) {
	for in, want := range map[string]string{
		"redis://127.0.0.1:6379":                        "redis://127.0.0.1:6379",
		"redis://u:pw@h:1/0":                            "redis://u:xxxxx@h:1/0",
		"rediss://:pw@h":                                "rediss://:xxxxx@h",
		"redis://pw@h":                                  "redis://:xxxxx@h",
		"redis://u:p@ss/w?rd@h":                         "redis://u:xxxxx@h",
		"redis://s:1?master_name=m&password=pw&db=1":    "redis://s:1?master_name=m&password=xxxxx&db=1",
		"redis://s:1?Sentinel_Password=pw#x?password=y": "redis://s:1?Sentinel_Password=xxxxx#x?password=xxxxx",
		"redis:u:pw@h":                                  "redis:xxxxx@h",
	} {
		if got := redactURL(in); got != want {
			t.Errorf("redactURL(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestScrubOnlyFenceURLs: the secrets of fence's URL flags are scrubbed;
// the command's own arguments (after "--") are not taken for secrets.
func TestScrubOnlyFenceURLs(t *testing.T) {
	args := []string{"exec", "--redis=redis://alice:hunter22@h", "--redis-sentinel", "redis://:sentinelpw@s?master_name=m", "n", "--", "ssh", "deploy@host"}
	got := scrub("auth hunter22 sentinelpw failed for deploy@host", args)
	if strings.Contains(got, "hunter22") || strings.Contains(got, "sentinelpw") || !strings.Contains(got, "deploy@host") {
		t.Fatalf("scrub: %q", got)
	}
}

// TestScrubRedlockList: every URL of a --redlock list has its secret
// scrubbed, not only the first or the last.
func TestScrubRedlockList(t *testing.T) {
	args := []string{"exec", "--redlock", "redis://:firstpw@a:1,redis://u:middlepw@b:1,redis://:lastpw1@c:1", "n", "--", "true"}
	got := scrub("auth firstpw middlepw lastpw1 failed", args)
	if strings.Contains(got, "pw") {
		t.Fatalf("scrub: %q", got)
	}
	if got := redactURLs("redis://:firstpw@a:1,redis://u:middlepw@b:1,redis://c:1"); got != "redis://:xxxxx@a:1,redis://u:xxxxx@b:1,redis://c:1" {
		t.Fatalf("redactURLs: %q", got)
	}
}

func TestChildEnv(t *testing.T) {
	got := strings.Join(childEnv([]string{"PATH=/bin", "FENCE_REDIS_URL=x", "FENCE_REDIS_SENTINEL_URL=x", "FENCE_REDIS_CLUSTER_URL=x",
		"FENCE_REDLOCK_URLS=x", "FENCE_PG_DSN=x", "FENCE_API_PASSWORD=x", "FENCE_TOKEN=1", "FENCE_LOCK=n", "MY_FENCE_REDIS_URL=kept"}), " ")
	if got != "PATH=/bin FENCE_TOKEN=1 FENCE_LOCK=n MY_FENCE_REDIS_URL=kept" {
		t.Fatalf("childEnv: %s", got)
	}
}
