# make test: installs what the tests need if it is missing (redis-server,
# postgresql), checks the code,
# and runs every test with the race detector against real servers.
SHELL := /bin/bash
GO ?= go
STATICCHECK := honnef.co/go/tools/cmd/staticcheck@v0.8.2
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: test deps check unit lab-quick lab bench demo fuzz

test: deps check unit lab-quick fuzz

# Debian packages of the servers the tests start: installed only if missing.
deps:
	@missing=""; \
	command -v redis-server >/dev/null || missing="$$missing redis-server"; \
	ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || command -v initdb >/dev/null || missing="$$missing postgresql"; \
	if [ -n "$$missing" ]; then \
		echo "installing:$$missing"; \
		$(SUDO) apt-get update -qq && $(SUDO) DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	fi

check:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) run $(STATICCHECK) ./...
	cd bench && $(GO) vet .

unit:
	$(GO) test -race -count=1 -timeout 10m ./...

# Each fuzz target briefly: go test fuzzes one target per invocation.
# One line per target.
FUZZTIME ?= 5s
fuzz:
	$(GO) test -run '^$$' -fuzz '^FuzzParseToken$$' -fuzztime $(FUZZTIME) -parallel 1 ./guard
	$(GO) test -run '^$$' -fuzz '^FuzzMiddlewareHeaders$$' -fuzztime $(FUZZTIME) -parallel 1 ./guard
	$(GO) test -run '^$$' -fuzz '^FuzzValidateName$$' -fuzztime $(FUZZTIME) -parallel 1 .
	$(GO) test -run '^$$' -fuzz '^FuzzRedisURL$$' -fuzztime $(FUZZTIME) ./internal/cli/
	$(GO) test -run '^$$' -fuzz '^FuzzDurations$$' -fuzztime $(FUZZTIME) ./internal/cli/
	$(GO) test -run '^$$' -fuzz '^FuzzAcks$$' -fuzztime $(FUZZTIME) ./internal/cli/

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
