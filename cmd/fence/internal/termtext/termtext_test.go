package termtext_test

import (
	"encoding/json"
	"reflect"
	"testing"

	"github.com/fencekit/fence/cmd/fence/internal/termtext"
)

func TestEscape(t *testing.T) {
	for in, want := range map[string]string{
		"":                           "",
		"127.0.0.1:6379 ERR unknown": "127.0.0.1:6379 ERR unknown",
		"héllo, 世界":                  "héllo, 世界",
		"a\x1b]0;pwned\x07b":         `a\x1b]0;pwned\ab`,
		"\x1b[2J\u009b31m":           `\x1b[2J\u009b31m`,
		"line\nnext\tcol\r":          `line\nnext\tcol\r`,
		"bad \xff\xfe utf-8":         `bad \xff\xfe utf-8`,
		"zero\u200bwidth \u202eRLO":  `zero\u200bwidth \u202eRLO`,
		"replacement \uFFFD stays":   "replacement \uFFFD stays",
		"\x00nul":                    `\x00nul`,
	} {
		if got := termtext.Escape(in); got != want {
			t.Errorf("Escape(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestJSON(t *testing.T) {
	for in, want := range map[string]string{
		`{"a":"b"}` + "\n":                 `{"a":"b"}` + "\n",
		`{"e":"x` + "\u009b31m" + `"}`:     `{"e":"x\u009b31m"}`,
		`["` + "\u202eRLO\x7f" + `"]`:      `["\u202eRLO\u007f"]`,
		`"` + "\U000E0001 tag" + `"`:       `"\udb40\udc01 tag"`,
		`"héllo, 世界 \u001b stays escaped"`: `"héllo, 世界 \u001b stays escaped"`,
	} {
		got := termtext.JSON([]byte(in))
		if string(got) != want {
			t.Errorf("JSON(%q) = %q, want %q", in, got, want)
		}
		var a, b any
		if json.Unmarshal([]byte(in), &a) == nil && (json.Unmarshal(got, &b) != nil || !reflect.DeepEqual(a, b)) {
			t.Errorf("JSON(%q) = %q decodes to %v, the input to %v", in, got, b, a)
		}
	}
}
