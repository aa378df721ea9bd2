package etcdserver

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"sync"
	"syscall"
)

// BinaryEnv names an environment variable that, if set, is the path of a
// prebuilt etcdmain binary to run instead of building one.
const BinaryEnv = "FENCE_ETCDMAIN"

// buildHint names the step that makes a build possible when it fails.
const buildHint = "the etcd server is built from internal/etcdserver/etcdmain with the go command: run from a checkout of fence with go on PATH and the module cache or proxy reachable (`cd internal/etcdserver/etcdmain && go build` shows the error), or set " + BinaryEnv + " to a built etcdmain"

var (
	binOnce sync.Once
	binPath string
	binErr  error
)

// Binary returns the path of the etcdmain binary, building it on first use.
// The build is cached in the user's cache directory under a hash of the
// module's go.mod, go.sum and sources, the Go version and the platform, so
// that test binaries of several packages and repeated runs share it; a cold
// build takes about a minute, a cached one nothing. Concurrent builds from
// parallel test binaries are serialised by a lock file, and each build is
// written to a temp file and renamed into place.
func Binary() (string, error) {
	binOnce.Do(func() { binPath, binErr = binary() })
	return binPath, binErr
}

func binary() (string, error) {
	if p := os.Getenv(BinaryEnv); p != "" {
		return p, nil
	}
	src, err := sourceDir()
	if err != nil {
		return "", err
	}
	sum, err := sourceHash(src)
	if err != nil {
		return "", fmt.Errorf("etcdserver: %w; %s", err, buildHint)
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	dir := filepath.Join(cache, "fence", "etcdmain-"+sum[:16])
	bin := filepath.Join(dir, "etcdmain")
	if _, err := os.Stat(bin); err == nil {
		return bin, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("etcdserver: %w", err)
	}
	lock, err := os.OpenFile(filepath.Join(dir, "build.lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return "", fmt.Errorf("etcdserver: %w", err)
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return "", fmt.Errorf("etcdserver: lock %s: %w", lock.Name(), err)
	}
	defer syscall.Flock(int(lock.Fd()), syscall.LOCK_UN) //nolint:errcheck // closing unlocks too
	if _, err := os.Stat(bin); err == nil {
		return bin, nil // another process built it while this one waited
	}
	goCmd, err := exec.LookPath("go")
	if err != nil {
		if goroot := os.Getenv("GOROOT"); goroot != "" {
			goCmd = filepath.Join(goroot, "bin", "go")
		} else {
			return "", fmt.Errorf("etcdserver: go command not found: %s", buildHint)
		}
	}
	tmp := filepath.Join(dir, fmt.Sprintf("etcdmain.tmp%d", os.Getpid()))
	cmd := exec.Command(goCmd, "build", "-o", tmp, ".")
	cmd.Dir = src
	cmd.Env = append(os.Environ(), "GOWORK=off", "CGO_ENABLED=0")
	out, err := cmd.CombinedOutput()
	if err != nil {
		_ = os.Remove(tmp)
		return "", fmt.Errorf("etcdserver: go build in %s: %w\n%s\n%s", src, err, out, buildHint)
	}
	if err := os.Rename(tmp, bin); err != nil {
		return "", fmt.Errorf("etcdserver: %w", err)
	}
	return bin, nil
}

// sourceDir returns the directory of the etcdmain module, next to this file.
func sourceDir() (string, error) {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return "", errors.New("etcdserver: cannot locate the etcdmain sources; " + buildHint)
	}
	dir := filepath.Join(filepath.Dir(file), "etcdmain")
	if _, err := os.Stat(filepath.Join(dir, "go.mod")); err != nil {
		return "", fmt.Errorf("etcdserver: etcdmain sources: %w; %s", err, buildHint)
	}
	return dir, nil
}

// sourceHash hashes what the build depends on: the module's files (go.mod,
// go.sum, *.go), the Go version and the platform.
func sourceHash(dir string) (string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return "", err
	}
	var names []string
	for _, e := range entries {
		n := e.Name()
		if !e.IsDir() && (n == "go.mod" || n == "go.sum" || filepath.Ext(n) == ".go") {
			names = append(names, n)
		}
	}
	slices.Sort(names)
	h := sha256.New()
	fmt.Fprintf(h, "%s %s/%s\n", runtime.Version(), runtime.GOOS, runtime.GOARCH)
	for _, n := range names {
		f, err := os.Open(filepath.Join(dir, n))
		if err != nil {
			return "", err
		}
		fmt.Fprintf(h, "%s\n", n)
		_, err = io.Copy(h, f)
		f.Close()
		if err != nil {
			return "", err
		}
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
