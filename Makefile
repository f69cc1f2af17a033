# authlimit: see README.md. Every target works on a fresh Debian machine with
# Go; the tests need redis-server on PATH (or AUTHLIMIT_TEST_REDIS_URL).

GO       ?= go
BIN      ?= bin/authlimit
# VERSION is the one version number: the binary's -version, the image's tag
# and the Helm chart's version and appVersion (a test holds them together).
VERSION  ?= $(shell cat VERSION)
REVISION ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
GOOS     ?= $(shell $(GO) env GOOS)
GOARCH   ?= $(shell $(GO) env GOARCH)
LDFLAGS  := -s -w -X main.version=$(VERSION)
PKGS     := ./...
FUZZTIME ?= 30s

# The image: its name, the platforms make image-context builds binaries for
# (the release builds linux/amd64 and linux/arm64 into one image), the
# container engine (podman, or docker where one runs) and the CA bundle it
# ships (Debian's ca-certificates).
IMAGE_REPO      ?= ghcr.io/authlimit/authlimit
IMAGE           ?= $(IMAGE_REPO):$(VERSION)
IMAGE_PLATFORMS ?= linux/$(GOARCH)
CONTAINER       ?= $(shell command -v podman 2>/dev/null || command -v docker 2>/dev/null || echo podman)
CA_BUNDLE       ?= /etc/ssl/certs/ca-certificates.crt

# The release's binaries: make dist.
DIST_PLATFORMS ?= linux/amd64 linux/arm64 darwin/amd64 darwin/arm64

STATICCHECK ?= $(GO) run honnef.co/go/tools/cmd/staticcheck@v0.8.2
ACTIONLINT  ?= $(GO) run github.com/rhysd/actionlint/cmd/actionlint@v1.7.12

.PHONY: build run test lint bench fuzz e2e image image-context dist chart-docs version clean

# build makes the static, stripped binary the image ships. GOOS and GOARCH
# choose another platform (make build GOOS=linux GOARCH=arm64).
build:
	CGO_ENABLED=0 GOOS=$(GOOS) GOARCH=$(GOARCH) $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN) ./cmd/authlimit

# run starts authlimit on :8080 with the embedded store and the default rule
# (100 requests per minute per client IP). Any AUTHLIMIT_* variable set in
# the environment applies.
run: build
	./$(BIN)

# version prints the version, for scripts (the release workflow).
version:
	@echo $(VERSION)

# lint fails on unformatted files, vet and staticcheck findings (the main
# module and e2e's), and actionlint's in .github/workflows.
lint:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)
	cd e2e && $(GO) vet -tags e2e ./...
	$(STATICCHECK) $(PKGS)
	cd e2e && $(STATICCHECK) -tags e2e ./...
	$(ACTIONLINT)

# ALLOC_PKGS are the packages with allocation tests (Test...Allocates...):
# make test runs them again without the race detector, which allocates on
# its own (they skip under it). HEAVY_PKGS are the packages with tests heavy
# by design (TestHeavy..., which call race.Heavy: hundreds of thousands of
# decisions, whose concurrency smaller tests cover under the race detector,
# which costs them five to ten times the CPU): make test runs them without
# the race detector (they skip under it). Both found by name, so a new one is
# never left out: race.Heavy fails a test not named TestHeavy....
ALLOC_PKGS = $(sort $(dir $(shell grep -rl --include='*_test.go' -E '^func Test[A-Za-z0-9_]*Allocates' . | grep -v '^\./e2e/')))
HEAVY_PKGS = $(sort $(dir $(shell grep -rl --include='*_test.go' -E '^func TestHeavy' . | grep -v '^\./e2e/')))
# RAW_PKGS are internal/rawsock and the packages whose sockets go through
# it. Under the race detector rawsock keeps the syscall package's reads and
# writes (the detector needs them to see a socket's write happen before its
# read); without it, on Linux, they are raw system calls. make test runs
# these packages' tests again without the race detector, so that the raw
# path is the one their sockets, deadlines and errors are tested on; a
# Redis Cluster's calls go through go-redis, not rawsock, so its tests
# (TestCluster...) are not run again. Found by import, so a new user of
# rawsock is never left out.
RAW_PKGS = $(sort ./internal/rawsock/ $(dir $(shell grep -rl --include='*.go' 'internal/rawsock"' . | grep -v -e '_test\.go$$' -e '^\./e2e/')))

# test runs every unit and integration test against real Redis, with the race
# detector (test-race), the e2e module's tests without the e2e tag (the
# deployment files, the chart's README, the version: test-files), and the
# allocation and heavy tests without the race detector, then prints the
# sliding_window_counter accuracy report, then RAW_PKGS's other tests
# without the race detector (test-norace). The three run at once,
# each one's output shown whole when it ends: the race run mostly waits (on
# Redis servers and clusters starting, processes of their own, file watches),
# and four of a package's tests that call t.Parallel run at once. CI runs make
# lint beside it.
test:
	@$(MAKE) --no-print-directory -j3 -Otarget test-race test-files test-norace

.PHONY: test-race test-files test-norace
test-race:
	$(GO) test -race -shuffle=on -count=1 -parallel 4 $(PKGS)

# The tests run make themselves: they get none of this make's job server.
test-files:
	cd e2e && env -u MAKEFLAGS -u MFLAGS $(GO) test -count=1 ./...

test-norace:
	$(GO) test -count=1 -run 'Allocates|^TestHeavy' $(sort $(ALLOC_PKGS) $(HEAVY_PKGS))
	@$(GO) test -count=1 -run '^TestSlidingCounterAccuracy$$' -v ./algo | grep 'accuracy on'
	$(GO) test -count=1 -shuffle=on -skip 'Allocates|^TestHeavy|^TestCluster' $(RAW_PKGS)

# e2e runs authlimit behind real nginx, nginx with Lua, Caddy, Traefik and
# HAProxy (with its Lua action and with SPOE), renders the chart with a real
# helm, and builds and runs the image with podman (see e2e/README.md for what
# it needs; the first run builds Traefik and helm). e2e is a module of its
# own (e2e/go.mod).
e2e:
	cd e2e && $(GO) test -tags e2e -count=1 -timeout 60m -v ./...

# image builds $(IMAGE) for this machine from Dockerfile with $(CONTAINER),
# without a registry: the image is FROM scratch and only copies what
# image-context prepared. podman builds in Docker's format, which keeps the
# HEALTHCHECK (the OCI format has none).
image: image-context
	$(CONTAINER) build $(if $(findstring podman,$(notdir $(CONTAINER))),--format docker) \
		--platform $(firstword $(IMAGE_PLATFORMS)) \
		--build-arg VERSION=$(VERSION) --build-arg REVISION=$(REVISION) \
		-t $(IMAGE) -f Dockerfile .

# image-context puts what the Dockerfile copies under bin/image: make build's
# binary for each of IMAGE_PLATFORMS (bin/image/linux/amd64/authlimit, ...)
# and the root file system (CA certificates, the user 65532 in /etc/passwd).
image-context:
	rm -rf bin/image
	for p in $(IMAGE_PLATFORMS); do \
		$(MAKE) --no-print-directory build GOOS=$${p%/*} GOARCH=$${p#*/} BIN=bin/image/$$p/authlimit || exit 1; \
	done
	mkdir -p bin/image/rootfs/etc/ssl/certs
	cp $(CA_BUNDLE) bin/image/rootfs/etc/ssl/certs/ca-certificates.crt
	printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/nonexistent:/sbin/nologin\n' >bin/image/rootfs/etc/passwd
	printf 'root:x:0:\nnonroot:x:65532:\n' >bin/image/rootfs/etc/group

# dist builds the release's archives into dist/ with make build, one per
# platform of DIST_PLATFORMS (authlimit_<version>_<os>_<arch>.tar.gz: the
# binary, README.md), and their SHA-256 sums in dist/checksums.txt.
dist:
	rm -rf dist
	for p in $(DIST_PLATFORMS); do \
		d=authlimit_$(VERSION)_$${p%/*}_$${p#*/}; \
		$(MAKE) --no-print-directory build GOOS=$${p%/*} GOARCH=$${p#*/} BIN=dist/$$d/authlimit || exit 1; \
		cp README.md dist/$$d/; \
		tar -C dist --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -czf dist/$$d.tar.gz $$d || exit 1; \
		rm -r dist/$$d; \
	done
	cd dist && sha256sum *.tar.gz >checksums.txt

# chart-docs regenerates the values table of deploy/helm/authlimit/README.md
# from values.yaml's comments (a test fails while it is out of date).
chart-docs:
	$(GO) generate ./internal/chartdoc

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
	rm -rf bin dist
