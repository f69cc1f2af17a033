# authlimit: see README.md. Every target works on a fresh Debian machine with
# Go; the tests need redis-server on PATH (or AUTHLIMIT_TEST_REDIS_URL).

GO       ?= go
BIN      ?= bin/authlimit
VERSION  ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS  := -s -w -X main.version=$(VERSION)
PKGS     := ./...
FUZZTIME ?= 30s

.PHONY: build run test lint bench fuzz e2e clean

# build makes the static binary the Dockerfile ships.
build:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN) ./cmd/authlimit

# run starts authlimit on :8080 with the embedded store and the default rule
# (100 requests per minute per client IP). Any AUTHLIMIT_* variable set in
# the environment applies.
run: build
	./$(BIN)

# lint fails on unformatted files and vet findings.
lint:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)
	$(GO) vet -tags e2e ./e2e/...

# test runs every unit and integration test against real Redis, with the race
# detector, then prints the sliding_window_counter accuracy report.
test: lint
	$(GO) test -race -shuffle=on -count=1 $(PKGS)
	$(GO) test -count=1 -run 'Allocates' $(PKGS)
	@$(GO) test -count=1 -run '^TestSlidingCounterAccuracy$$' -v ./algo | grep 'accuracy on'

# e2e runs authlimit behind real nginx, nginx with Lua, Caddy, Traefik and
# HAProxy, with its Lua action and with SPOE (see e2e/README.md for what it
# needs; the first run builds Traefik).
e2e:
	$(GO) test -tags e2e -count=1 -timeout 60m -v ./e2e/...

# bench builds authlimit and the harness in bench/, runs every system under
# every workload at 1, 4, 16, 50 and 500 connections (3 rounds, systems
# alternated; about an hour and a half: 24 systems, two workloads), measures
# Redis memory per key, runs the Go micro-benchmarks (go test -bench) and
# writes bench/RESULTS.md. BENCHFLAGS passes flags (bin/bench -help), e.g. a
# quick check: make bench BENCHFLAGS='-rounds 1 -duration 1s -warmup 200ms
# -conns 50 -micro=false -out /tmp/RESULTS.md'
BENCHFLAGS ?=
bench: build
	$(GO) build -o bin/bench ./bench
	./bin/bench -authlimit $(BIN) -go $(GO) $(BENCHFLAGS)

# fuzz runs each fuzz target for FUZZTIME; new findings land in testdata.
fuzz:
	for f in FuzzParse FuzzClientIP FuzzAppendPath FuzzHeaderName; do \
		$(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZTIME) ./rules || exit 1; \
	done
	$(GO) test -run '^$$' -fuzz '^FuzzAuth$$' -fuzztime $(FUZZTIME) ./handler
	$(GO) test -run '^$$' -fuzz '^FuzzCheck$$' -fuzztime $(FUZZTIME) ./front/extauthz
	$(GO) test -run '^$$' -fuzz '^FuzzAuthPath$$' -fuzztime $(FUZZTIME) ./handler
	$(GO) test -run '^$$' -fuzz '^FuzzReadRequest$$' -fuzztime $(FUZZTIME) ./front/extauthz
	$(GO) test -run '^$$' -fuzz '^FuzzReadRequest$$' -fuzztime $(FUZZTIME) ./front/rls
	$(GO) test -run '^$$' -fuzz '^FuzzConn$$' -fuzztime $(FUZZTIME) ./front/grpcwire
	$(GO) test -run '^$$' -fuzz '^FuzzConn$$' -fuzztime $(FUZZTIME) ./front/spoa
	$(GO) test -run '^$$' -fuzz '^FuzzReadRequest$$' -fuzztime $(FUZZTIME) ./front/spoa

clean:
	rm -rf bin
