# The platform gateway: a custom Caddy build with the platform modules.
#
#   make run     build, start the gateway with Caddyfile.example, the example
#                backends and a demo key, and print curl lines to try it
#   make test    every test, race detector on, package by package (what CI runs;
#                the first run compiles the dependencies under -race: minutes)
#   make test-quick  every test without -race, unchanged packages' results
#                from Go's test cache: what to run while editing
#   make fuzz    every fuzz target for FUZZTIME (10s) each (CI runs it too)
#   make bench   the benchmark against plain Caddy reverse_proxy: req/s and
#                the Caddy process's CPU per request (~5 minutes)
#   make bench-fleet  the gateway on PostgreSQL (1 and 2 nodes) against
#                the same node on bbolt: req/s, CPU per call, round trips, latency
#   make bench-scale  the store with 1M keys and 10M ledger rows against an
#                empty one (minutes, several GB in a temp dir)
#   make bench-scale-ledger  the segmented usage ledger grown to
#                SCALE_LEDGER_ROWS rows (default 10M; minutes, ~200 MB)
#   make bench-micro  the go test micro-benchmarks (benchstat-friendly) and
#                the sync invoke chain's allocation budget
#   make sim     the storage simulation (docs/reliability.md): seeds from
#                SEED (0: random, printed) for DURATION (default 1m), FAULTS
#                crash or damage; OPS='...' replays one trace a failure printed
#   make build   just the binary (bin/caddy)
#   make xcaddy  the same binary built the xcaddy way (bin/caddy-xcaddy)
#   make lint    go vet, gofmt, staticcheck and the docs' links (CI runs it too)
#   make screenshots  the browser tests (chromium) with SCREENSHOTS_DIR set:
#                docs/img/*.png, shown in docs/console.md and docs/storefront.md

GO      ?= go
BIN     := bin
CADDY   := $(BIN)/caddy

# Every package of the module but tmp/ (make run's scratch directory,
# ignored by git: a Go file left there is no package of the gateway).
PKGS     = $(shell $(GO) list -e ./... | grep -v '^$(shell $(GO) list -m)/tmp\(/\|$$\)')

.PHONY: sim screenshots build run test test-quick verify-systemd test-short fuzz bench bench-fleet bench-scale bench-scale-ledger bench-micro xcaddy vet lint clean

build:
	$(GO) build -o $(CADDY) ./caddy

run: build
	$(GO) build -o $(BIN)/example-backend ./examples/backend
	$(GO) build -o $(BIN)/example-asyncbackend ./examples/asyncbackend
	$(GO) build -o $(BIN)/example-reporter ./examples/reporter
	./scripts/run-demo.sh

# One package after another (the in-process Caddy servers of different
# packages share caddytest's admin port), each announced as it starts so a
# long end-to-end package is not minutes of silence; scripts/test.sh.
test:
	$(GO) vet $(PKGS)
	GO=$(GO) ./scripts/test.sh

# The quick variant: no race detector (so no -race build of the
# dependencies), test results cached per package while its code and
# inputs are unchanged, still one package at a time (-p 1: caddytest's
# shared admin port). Not what CI runs; make test before you push.
test-quick:
	$(GO) test -p 1 $(PKGS)

# The systemd unit in contrib/systemd, checked with systemd-analyze verify
# (CI runs it; it installs systemd when missing and it can).
verify-systemd:
	./scripts/verify-systemd.sh

test-short:
	$(GO) test -p 1 -count=1 $(PKGS)

vet:
	$(GO) vet $(PKGS)
	@test -z "$$(gofmt -l $$(find . -name '*.go' -not -path './tmp/*'))" || (gofmt -l $$(find . -name '*.go' -not -path './tmp/*') && false)

# staticcheck, built from the pinned tools module (tools/staticcheck), and
# the docs' links, anchors and cited files and tests (scripts/doccheck).
lint: vet
	cd tools/staticcheck && $(GO) build -o ../../$(BIN)/staticcheck honnef.co/go/tools/cmd/staticcheck
	$(BIN)/staticcheck $(PKGS)
	$(GO) run ./scripts/doccheck

# xcaddy itself is built from the tools module (tools/xcaddy/go.mod pins
# its version), as `go install …@version` is not available everywhere; the
# Caddy version is the one go.mod requires, so both builds are the same
# Caddy. The root package imports every module package, which is what
# xcaddy's generated main imports.
XCADDY        := $(BIN)/xcaddy
CADDY_XCADDY  := $(BIN)/caddy-xcaddy
CADDY_VERSION  = $(shell $(GO) list -m -f '{{.Version}}' github.com/caddyserver/caddy/v2)

$(XCADDY): tools/xcaddy/go.mod tools/xcaddy/go.sum
	cd tools/xcaddy && $(GO) build -o ../../$(XCADDY) github.com/caddyserver/xcaddy/cmd/xcaddy

xcaddy:
	@echo "make xcaddy: builds xcaddy from tools/xcaddy (bin/xcaddy), then xcaddy builds Caddy $(CADDY_VERSION)"
	@echo "  with this module in a temp dir into $(CADDY_XCADDY). Nothing to install by hand, but the first"
	@echo "  run downloads about 70 modules and compiles Caddy once more: several minutes (about 4 on"
	@echo "  2 cores); later runs take them from Go's module and build caches (about a minute)."
	@$(MAKE) --no-print-directory $(XCADDY)
	XCADDY_SKIP_CLEANUP=0 $(XCADDY) build $(CADDY_VERSION) \
		--output $(CADDY_XCADDY) --with github.com/platformgw/gateway@v0.0.0=.

# The seed corpora (*/testdata/fuzz/) already run as tests in make test;
# this fuzzes each target for new inputs (scripts/fuzz.sh lists them).
fuzz:
	./scripts/fuzz.sh

bench: build
	./scripts/bench.sh

# Needs a PostgreSQL server (PLATFORM_TEST_PG_DSN, as make test; a
# database is created and dropped), psql and wrk; docs/fleet.md.
bench-fleet: build
	./scripts/bench-fleet.sh

bench-scale:
	$(GO) test -tags scale -run '^TestScale$$' -v -count=1 -timeout 60m ./internal/store/boltstore

# SCALE_LEDGER_ROWS=100000000 for the 100M-row figures of docs/performance.md.
bench-scale-ledger:
	SCALE_LEDGER_ROWS=$${SCALE_LEDGER_ROWS:-10000000} $(GO) test -tags scale -run '^TestLedgerScale$$' -v -count=1 -timeout 120m ./internal/store/ledger

# -count 6 gives benchstat enough samples: make bench-micro > new.txt,
# then benchstat old.txt new.txt. The last step is the whole sync invoke
# chain in process (real Caddy, bbolt in a temp dir) against plain
# reverse_proxy, and the allocation budget of a call
# (TestChainAllocBudget, skipped under -race); E2E_ADMIN_PORT and
# E2E_HTTP_PORT move its ports.
bench-micro:
	$(GO) test -run '^$$' -bench . -benchmem -count 6 ./internal/signing ./internal/servicekey ./internal/store/boltstore ./internal/engine
	$(GO) test -run '^(TestChainAllocBudget|TestEndCallAllocs)$$' -bench '^(BenchmarkChain|BenchmarkEndCall)$$' -benchmem -count 6 ./internal/platformgw

# The storage simulation: the real store on a simulated disk that crashes
# and fails (internal/store/boltstore/sim_test.go, docs/reliability.md).
SEED     ?= 0
DURATION ?= 1m
FAULTS   ?= crash
OPS      ?=
sim:
	$(GO) test -count=1 -timeout 0 -run '^TestSim$$' -v ./internal/store/boltstore -args \
		-sim.seed=$(SEED) -sim.duration=$(DURATION) -sim.faults=$(FAULTS) -sim.ops='$(OPS)'

clean:
	rm -rf $(BIN) tmp

# The browser tests of the web pages (TestXxxInBrowser, Debian's chromium
# through chromedp) with SCREENSHOTS_DIR set, which makes them save a PNG
# of each page into docs/img for docs/console.md and docs/storefront.md.
# Set E2E_ADMIN_PORT and E2E_HTTP_PORT when another test server may be
# running.
SCREENSHOT_PKGS ?= ./internal/console ./internal/storefront
screenshots:
	BROWSER_TESTS=1 SCREENSHOTS_DIR=$(CURDIR)/docs/img $(GO) test -count=1 -run 'InBrowser' $(SCREENSHOT_PKGS)
	BROWSER_TESTS=1 SCREENSHOTS_DIR=$(CURDIR)/docs/img $(GO) test -count=1 -run 'Browser' ./internal/portal
