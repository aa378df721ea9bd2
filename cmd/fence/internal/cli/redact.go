package cli

import (
	"net/url"
	"os"
	"strings"
)

// mask replaces a password in what fence prints.
const mask = "xxxxx"

// redactURL returns a Redis URL with its credentials masked, without
// parsing it (a URL that does not parse must be redacted too): everything
// between "://" and the last "@" except a leading user name, and the value
// of every query parameter whose name mentions a password (go-redis reads
// password= and sentinel_password= on Sentinel URLs). It errs on the side of
// masking too much: a password with an unescaped "/", "?" or "@" in it is
// still masked whole.
func redactURL(s string) string {
	if from, to, ok := userinfoSecret(s); ok {
		sep := ""
		if strings.HasSuffix(s[:from], "://") {
			sep = ":" // "redis://secret@host" shows as "redis://:xxxxx@host"
		}
		s = s[:from] + sep + mask + s[to:]
	}
	return maskParams(s, func(string) string { return mask })
}

// userinfoSecret returns where the part of URL s that may be a password
// begins and ends: after "user:" in "scheme://user:pw@host"; the whole
// user information of "scheme://secret@host", whose one part may be a
// password; and, in "scheme:u:pw@host" (no "//": an opaque URL to
// url.Parse), everything between the scheme and the last "@". ok is false
// when there is nothing before an "@".
func userinfoSecret(s string) (from, to int, ok bool) {
	at := strings.LastIndex(s, "@")
	// The scheme ends at the first ":"; only a "//" right after it makes
	// the URL hierarchical: a "://" further on (in "0:u:pw@://", say) is
	// in the opaque part, and the secret lies before the "@".
	if i := strings.IndexByte(s, ':'); i >= 0 && strings.HasPrefix(s[i:], "://") {
		if at <= i+3 {
			return 0, 0, false
		}
		from = i + 3
		if c := strings.IndexByte(s[from:at], ':'); c >= 0 {
			from += c + 1
		}
		return from, at, true
	}
	if at < 0 {
		return 0, 0, false
	}
	c := strings.IndexByte(s, ':')
	if c > at {
		c = -1
	}
	return c + 1, at, true
}

// maskParams replaces the value of every parameter after the first "?" or
// "#" whose name says it holds a secret with f(value). Any of "?", "#", "&"
// and ";" ends a parameter: a "?" in a fragment must not hide a password=
// behind it from the masking.
func maskParams(s string, f func(string) string) string {
	q := strings.IndexAny(s, "?#")
	if q < 0 {
		return s
	}
	var b strings.Builder
	b.WriteString(s[:q+1])
	rest := s[q+1:]
	for {
		end := strings.IndexAny(rest, "?#&;")
		p := rest
		if end >= 0 {
			p = rest[:end]
		}
		if k, v, ok := strings.Cut(p, "="); ok && secretParam(k) {
			p = k + "=" + f(v)
		}
		b.WriteString(p)
		if end < 0 {
			return b.String()
		}
		b.WriteByte(rest[end])
		rest = rest[end+1:]
	}
}

// secretParam reports whether a query parameter's name says it holds a
// secret.
func secretParam(k string) bool {
	if u, err := url.QueryUnescape(k); err == nil {
		k = u
	}
	k = strings.ToLower(k)
	return strings.Contains(k, "pass") || strings.Contains(k, "secret") || strings.Contains(k, "token")
}

// urlSecrets returns the strings of s that redactURL masks, raw and
// percent-decoded, for scrubbing messages that fence did not compose itself.
func urlSecrets(s string) []string {
	var out []string
	add := func(v string) {
		if v == "" {
			return
		}
		out = append(out, v)
		if d, err := url.PathUnescape(v); err == nil && d != v {
			out = append(out, d)
		}
		if d, err := url.QueryUnescape(v); err == nil && d != v {
			out = append(out, d)
		}
	}
	if from, to, ok := userinfoSecret(s); ok {
		add(s[from:to])
	}
	maskParams(s, func(v string) string { add(v); return v })
	return out
}

// minScrub is the shortest secret scrubbed from free text: shorter ones
// would mangle messages, and the messages fence composes are redacted
// structurally anyway.
const minScrub = 4

// scrub removes every secret of the URLs fence may have been given (its URL
// flags and its FENCE_ credential variables) from msg: the last line of
// defence for error text that came from a library.
func scrub(msg string, args []string) string {
	var sources []string
	for _, kv := range os.Environ() {
		if k, v, ok := strings.Cut(kv, "="); ok && credentialVar(k) {
			sources = append(sources, v)
		}
	}
	sources = append(sources, urlArgs(args)...)
	for _, src := range sources {
		// --redlock and --etcd take comma-separated lists of URLs: each one's secrets too.
		var secrets []string
		for _, part := range append([]string{src}, splitURLs(src)...) {
			secrets = append(secrets, urlSecrets(part)...)
		}
		for _, secret := range secrets {
			if len(secret) >= minScrub {
				msg = strings.ReplaceAll(msg, secret, mask)
			}
		}
	}
	return msg
}

// urlArgs returns the values given to fence's URL flags in args, up to the
// "--" before a command (whose own arguments are not fence's secrets), and
// every other argument before it that holds a URL ("://"), after the first
// "=" of a flag: a URL flag mistyped ("-redis=redis://:pw@host", one dash)
// or a URL given to another flag is quoted whole in pflag's usage error.
func urlArgs(args []string) []string {
	var out []string
	for i, a := range args {
		if a == "--" {
			break
		}
		known := false
		for _, f := range []string{"--redis", "--redis-sentinel", "--redis-cluster", "--redlock", "--etcd"} {
			switch {
			case a == f && i+1 < len(args):
				out = append(out, args[i+1])
				known = true
			case strings.HasPrefix(a, f+"="):
				out = append(out, a[len(f)+1:])
				known = true
			}
		}
		if !known && strings.Contains(a, "://") {
			if k, v, ok := strings.Cut(a, "="); ok && strings.HasPrefix(k, "-") && !strings.Contains(k, "://") {
				a = v
			}
			out = append(out, a)
		}
	}
	return out
}

// credentialVar reports whether an environment variable may carry fence's
// credentials: FENCE_REDIS_*, FENCE_ETCD_* (endpoints may carry
// user:password@) and any FENCE_ variable named like a URL, DSN, password
// or secret. These are not passed to the command fence exec runs.
func credentialVar(k string) bool {
	if !strings.HasPrefix(k, "FENCE_") {
		return false
	}
	if strings.HasPrefix(k, "FENCE_REDIS_") || strings.HasPrefix(k, "FENCE_ETCD_") {
		return true
	}
	for _, w := range []string{"URL", "DSN", "PASS", "SECRET", "CREDENTIAL"} {
		if strings.Contains(k, w) {
			return true
		}
	}
	return false
}

// childEnv is env without fence's credential variables.
func childEnv(env []string) []string {
	out := make([]string, 0, len(env))
	for _, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		if !credentialVar(k) {
			out = append(out, kv)
		}
	}
	return out
}

// splitURLs splits a comma-separated list of URLs (--redlock, --etcd). A
// comma is legal in a URL's user information, so a piece that holds the
// rest of a password ("pw2@host" after "redis://user:pw1") is joined back
// to the URL it belongs to rather than read as a URL of its own, whose
// error message would print the half of the password before it.
func splitURLs(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if n := len(out); n > 0 && !strings.Contains(p, "://") && strings.Contains(p, "@") {
			if prev := out[n-1]; strings.Contains(prev, "://") && !strings.Contains(prev, "@") {
				out[n-1] = prev + "," + p
				continue
			}
		}
		out = append(out, p)
	}
	return out
}
