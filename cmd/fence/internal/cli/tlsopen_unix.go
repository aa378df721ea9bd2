//go:build unix

package cli

import "syscall"

// pemOpenFlags opens a TLS flag's file without waiting for a writer: a
// FIFO nobody writes to reads as empty at once instead of blocking fence
// for good in open(2). A pipe that has a writer (process substitution)
// reads as usual.
const pemOpenFlags = syscall.O_NONBLOCK
