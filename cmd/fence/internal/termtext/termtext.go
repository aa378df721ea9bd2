// Package termtext makes text that came from a server safe to print on a
// terminal.
//
// fence prints what servers tell it: addresses a replica announces,
// configuration values, error replies. A server (or whoever controls one)
// can put control characters there, and an ESC or CSI sequence printed as
// it is retitles the window, clears the screen or rewrites lines printed
// before it, such as a doctor's critical finding.
package termtext

import (
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Escape returns s with every character that is not printable (control
// characters, C1 controls such as CSI, format characters, bytes that are
// not UTF-8) written as a Go escape (\x1b, \u009b); a space stays a space.
// Text that needs none comes back as it is.
func Escape(s string) string {
	if !strings.ContainsFunc(s, unprintable) && utf8.ValidString(s) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n == 1:
			b.WriteString(`\x`)
			b.WriteString(strconv.FormatUint(uint64(s[i])>>4, 16))
			b.WriteString(strconv.FormatUint(uint64(s[i])&15, 16))
		case unprintable(r):
			q := strconv.QuoteRuneToASCII(r)
			b.WriteString(q[1 : len(q)-1])
		default:
			b.WriteRune(r)
		}
		i += n
	}
	return b.String()
}

func unprintable(r rune) bool { return r != ' ' && !unicode.IsPrint(r) }
