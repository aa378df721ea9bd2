package main

import (
	"os"
	"runtime"
	"syscall"
)

// stopSelf stops the process with SIGSTOP sent to the calling thread, so
// that this thread stops before it runs on (a SIGSTOP sent to the process
// may be taken by another thread while this one goes on for a moment).
func stopSelf() error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	return syscall.Tgkill(os.Getpid(), syscall.Gettid(), syscall.SIGSTOP)
}
