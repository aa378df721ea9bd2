package doctor

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestACLCommandsCoverScripts: the doctor asks ACL DRYRUN about the
// commands fence's scripts run, from a list of its own, which fell behind
// the scripts: RENAME (the released-by record's, 274769f) until 427644b,
// and LLEN, HLEN and LRANGE (grant.lua's compaction of the queue, run by
// every try that queues) still ("redislock's scripts run LLEN, which the
// doctor does not ask about", and HLEN, LRANGE). A user denied one of them
// had every waiting Acquire fail while the doctor found nothing. Every
// command a script of redislock's or redlock's calls by name with
// redis.call is asked about (redis.pcall's are optional: their refusal is
// handled in the script).
func TestACLCommandsCoverScripts(t *testing.T) {
	called := regexp.MustCompile(`redis\.call\('([A-Z]+)'`)
	for _, c := range []struct {
		pkg  string
		cmds [][]any
	}{
		{"redislock", aclCommands("fence")},
		{"redlock", redlockCommands("fence")},
	} {
		asked := map[string]bool{}
		for _, args := range c.cmds {
			asked[strings.ToUpper(args[0].(string))] = true
		}
		files, err := filepath.Glob(filepath.Join("..", "..", "..", "..", c.pkg, "*.lua"))
		if err != nil || len(files) == 0 {
			t.Fatalf("%s's scripts: %v (%d files)", c.pkg, err, len(files))
		}
		missing := map[string]bool{}
		for _, f := range files {
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range called.FindAllStringSubmatch(string(b), -1) {
				if !asked[m[1]] && !missing[m[1]] {
					missing[m[1]] = true
					t.Errorf("%s's scripts run %s (%s), which the doctor does not ask about", c.pkg, m[1], filepath.Base(f))
				}
			}
		}
	}
}
