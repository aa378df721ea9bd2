# make test: installs what the tests need if it is missing (redis-server,
# postgresql, ZooKeeper), checks the code,
# and runs every test with the race detector against real servers.
SHELL := /bin/bash
GO ?= go
STATICCHECK := honnef.co/go/tools/cmd/staticcheck@v0.8.2
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: test deps check unit lab-quick lab bench demo fuzz

# The unit tests mostly wait (on servers, leases and timeouts), so the fault
# lab's short run and the fuzz targets run beside them, one at a time
# (-j2); -Otarget prints each step's output whole when it ends, and -k runs
# them all even when one fails (make test still fails).
test: deps check
	@$(MAKE) --no-print-directory -k -j2 -Otarget unit lab-quick fuzz

# Debian packages of the servers the tests start: installed only if missing.
# ZooKeeper is libzookeeper-java, the jars of Debian's zookeeper package
# without its service, whose dependency on default-jre would pull a desktop
# JRE; internal/zkserver runs it on a headless one (≈ 16 s with Java present).
deps:
	@missing=""; \
	command -v redis-server >/dev/null || missing="$$missing redis-server"; \
	ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || command -v initdb >/dev/null || missing="$$missing postgresql"; \
	[ -e /usr/share/java/zookeeper.jar ] || missing="$$missing libzookeeper-java"; \
	command -v java >/dev/null || missing="$$missing default-jre-headless"; \
	if [ -n "$$missing" ]; then \
		echo "installing:$$missing"; \
		$(SUDO) apt-get update -qq && $(SUDO) DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; \
	fi

# Every module of the workspace (go.work): the library, the command, the
# examples, the SQL tests, the PostgreSQL helper, the ZooKeeper lock, the etcd
# lock and the etcd server the tests run (built on first use, about a minute,
# then cached in the user's cache dir); the benchmarks are vetted. The
# packages whose tests take longest come first, longest first, so that go
# test starts them first (it runs packages in the order listed, -p at a
# time; a package named twice runs once): on 2026-12-04, redislock 378 s,
# zklock 267, redlock 256, cli 247, etcdlock 229, fencerueidis 186,
# tests/pglock 182, tests/guard 157, lab 152, doctor 71, then the examples
# (43 each) and the rest (under 20). Listed by module, fencerueidis had
# started last and ran alone for its last two minutes.
MODULES := ./redislock/... ./zklock/... ./redlock/... ./cmd/fence/internal/cli ./etcdlock/... ./fencerueidis/... ./tests/pglock ./tests/guard ./cmd/fence/lab ./cmd/fence/internal/doctor ./cmd/fence/... ./tests/... ./examples/... ./... ./fenceotel/... ./fenceprom/... ./internal/pgtest/... ./internal/etcdserver/etcdmain/...
# Their directories: each go.mod and go.sum must be what GOWORK=off go mod tidy
# makes of it (not go work sync, which copies the workspace's versions, such as
# the command's golang.org/x/sys, into the library's go.mod).
MODULE_DIRS := . bench cmd/fence examples fenceotel fenceprom fencerueidis internal/pgtest tests zklock etcdlock internal/etcdserver/etcdmain

check:
	@for m in $(MODULE_DIRS); do (cd $$m && GOWORK=off $(GO) mod tidy -diff) || { echo "$$m: go.mod/go.sum not tidy (cd $$m && GOWORK=off go mod tidy)"; exit 1; }; done
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet $(MODULES) ./bench/...
	$(GO) run $(STATICCHECK) $(MODULES)

# -p 5 on 2 CPUs: the packages' tests mostly wait (on servers, leases and
# timeouts), so five test binaries at a time overlap their waits. Fresh
# clones on 2026-12-04, with the lab and the fuzz targets beside (make -j2):
# the unit step took 14.2 min at -p 4 as listed by module, 12.7 min at -p 4
# longest first, 11.8 min at -p 5 longest first (the CPUs 73% busy on
# average; redislock, which starts first, then takes 482 s, against 408 s
# at -p 4, and is the step's longest path), 12.6 min at -p 6 as listed by
# module (97% busy; every package 25% slower).
# The allocation ceilings are exact only without the race detector (which
# adds a few at random): their tests run once more without it.
# .ci/unit runs them: the race detector's reports go to files, printed
# after the run when it fails, and a failure whose only race is
# go-zookeeper's own (see the README) runs the packages that use it once
# more.
RACE_LOGS := $(or $(TMPDIR),/tmp)/fence-race
unit:
	./.ci/unit $(GO) $(RACE_LOGS) $(MODULES)
	$(GO) test -count=1 -run 'Allocs' ./redislock

# Each fuzz target briefly: go test fuzzes one target per invocation. The
# budgets are counts of executions (N x), sized to a few seconds each here,
# not durations: with a duration, go1.26's fuzz coordinator can report a
# spurious "context deadline exceeded" when the time runs out
# (golang/go#75804, fixed in go1.27). -vet=off: make check vets them.
FUZZ = $(GO) test -vet=off -run '^$$' -parallel 1 -fuzz
fuzz:
	$(FUZZ) '^FuzzParseToken$$' -fuzztime 50000x ./guard
	$(FUZZ) '^FuzzMiddlewareHeaders$$' -fuzztime 50000x ./guard
	$(FUZZ) '^FuzzValidateName$$' -fuzztime 50000x .
	$(FUZZ) '^FuzzRedisURL$$' -fuzztime 3000x ./cmd/fence/internal/cli/
	$(FUZZ) '^FuzzDurations$$' -fuzztime 10000x ./cmd/fence/internal/cli/
	$(FUZZ) '^FuzzAcks$$' -fuzztime 5000x ./cmd/fence/internal/cli/

# The fault lab's short version: every scenario, control and protected.
lab-quick:
	$(GO) run ./cmd/fence lab --quick

# The full fault lab; its report is kept in docs/lab/.
lab:
	$(GO) run ./cmd/fence lab --out docs/lab

# Benchmarks against peer libraries (its own module, bench/); writes BENCHMARKS.md.
bench: deps
	cd bench && $(GO) run . -out ../BENCHMARKS.md

demo:
	$(GO) run ./cmd/fence demo
