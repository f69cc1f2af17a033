# authlimit: see README.md. Every target works on a fresh Debian machine with
# Go; the tests need redis-server on PATH (or AUTHLIMIT_TEST_REDIS_URL).

GO       ?= go
BIN      ?= bin/authlimit
PKGS     := ./...

.PHONY: build test lint bench fuzz clean

build:
	CGO_ENABLED=0 $(GO) build -trimpath -o $(BIN) ./cmd/authlimit

# lint fails on unformatted files and vet findings.
lint:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)

# test runs every unit and integration test against real Redis, with the race
# detector, then prints the sliding_window_counter accuracy report.
test: lint
	$(GO) test -race -shuffle=on -count=1 $(PKGS)
	@$(GO) test -count=1 -run '^TestSlidingCounterAccuracy$$' -v ./algo | grep 'accuracy on'

bench:
	$(GO) test -run '^$$' -bench . -benchmem $(PKGS)

clean:
	rm -rf bin
