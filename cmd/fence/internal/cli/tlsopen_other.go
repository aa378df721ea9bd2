//go:build !unix

package cli

// pemOpenFlags: see tlsopen_unix.go.
const pemOpenFlags = 0
