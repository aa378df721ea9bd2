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
	"bytes"
	"fmt"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf16"
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

// JSON returns the JSON text b with every unprintable character but the
// line break written as a \u escape, which decodes to the same string.
// encoding/json escapes the C0 controls but writes DEL, the C1 controls and
// the format characters as they are; outside strings its JSON holds only
// printable ASCII (and Encoder's final line break), so every such character
// is inside a string, where the escape is valid. b must be valid UTF-8, as
// encoding/json writes it.
func JSON(b []byte) []byte {
	if !bytes.ContainsFunc(b, func(r rune) bool { return r != '\n' && unprintable(r) }) {
		return b
	}
	out := make([]byte, 0, len(b)+16)
	for len(b) > 0 {
		r, n := utf8.DecodeRune(b)
		if r == '\n' || !unprintable(r) {
			out = append(out, b[:n]...)
		} else if r1, r2 := utf16.EncodeRune(r); r1 != unicode.ReplacementChar {
			out = fmt.Appendf(out, `\u%04x\u%04x`, r1, r2)
		} else {
			out = fmt.Appendf(out, `\u%04x`, r)
		}
		b = b[n:]
	}
	return out
}
