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
	args = []string{"exec", "--etcd", "http://root:etcdpw1@h1:2379,http://root:etcdpw1@h2:2379", "n", "--", "true"}
	if got := scrub("etcd auth etcdpw1 failed", args); strings.Contains(got, "etcdpw1") {
		t.Fatalf("scrub of an --etcd list: %q", got)
	}
}

func TestEtcdConfig(t *testing.T) {
	cfg, err := etcdConfig("http://root:pw@h1:2379, h2:2379,https://h3:2379/")
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(cfg.Endpoints, " "); got != "http://h1:2379 http://h2:2379 https://h3:2379" || cfg.Username != "root" || cfg.Password != "pw" || cfg.TLS == nil {
		t.Fatalf("etcdConfig: %q user %q password %q TLS %v", got, cfg.Username, cfg.Password, cfg.TLS != nil)
	}
	for _, bad := range []string{"", ",", "ftp://h:1", "http://h:1/v3", "http://a:pw@h1,http://b:pw@h2", "http://:secretpw@h:1?x=1"} {
		_, err := etcdConfig(bad)
		if err == nil {
			t.Errorf("etcdConfig(%q) accepted", bad)
		} else if strings.Contains(err.Error(), "secretpw") {
			t.Errorf("etcdConfig(%q): the error shows the password: %v", bad, err)
		}
	}
	if got := redactEndpoints("http://u:pw1@h1,http://u:pw2@h2"); got != "http://u:xxxxx@h1,http://u:xxxxx@h2" {
		t.Fatalf("redactEndpoints: %q", got)
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
		"FENCE_REDLOCK_URLS=x", "FENCE_PG_DSN=x", "FENCE_API_PASSWORD=x", "FENCE_ETCD_ENDPOINTS=http://u:pw@h:2379", "FENCE_TOKEN=1", "FENCE_LOCK=n", "MY_FENCE_REDIS_URL=kept"}), " ")
	if got != "PATH=/bin FENCE_TOKEN=1 FENCE_LOCK=n MY_FENCE_REDIS_URL=kept" {
		t.Fatalf("childEnv: %s", got)
	}
}
