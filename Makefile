# The two commands of the README: `make demo` (the main job) and `make test`.
GO ?= go

DURATION ?= 5m
RATE ?= 100

.PHONY: test check slowest demo vet freeze bench bench-200k bench-1m bench-quick bench-capacity bench-scale chaos failover sim check-postgres check-chromium

## test: vet, then the whole suite with the race detector, on a private PostgreSQL (this module, then the
## prometheus, otel and browsertest modules; the console's browser tests need Chromium), then a
## benchmark smoke run (bench-quick: it keeps the bench module building; it asserts nothing about speed)
test: check-postgres check-chromium vet
	$(GO) test -race -count=1 -timeout 15m -json ./... | tee $(TESTS_JSON) | $(TESTTIMES)
	cd prometheus && $(GO) test -race -count=1 -timeout 5m ./...
	cd otel && $(GO) test -race -count=1 -timeout 5m ./...
	cd browsertest && $(GO) test -race -count=1 -timeout 5m ./...
	$(MAKE) bench-quick

## vet: go vet and staticcheck in every module, and goimports' formatting everywhere (the tools run
## at pinned versions through go run, fetched from the module proxy on first use; the grouping of
## imports, which goimports does not check, is TestImportsAreInGoimportsGroups)
MODULES := . bench prometheus otel browsertest
GOIMPORTS ?= $(GO) run golang.org/x/tools/cmd/goimports@v0.53.0
STATICCHECK ?= $(GO) run honnef.co/go/tools/cmd/staticcheck@v0.8.2
vet:
	@set -e; for m in $(MODULES); do \
	  echo "vet and staticcheck: $$m"; \
	  (cd $$m && $(GO) vet ./... && $(STATICCHECK) ./...); \
	done
	@out=$$($(GOIMPORTS) -l .); if [ -n "$$out" ]; then echo "goimports would change:"; echo "$$out"; exit 1; fi

## check: the fast tier to run while working (under 3 minutes on a 2-core machine): vet, then this
## module's tests with -short, without the race detector: no chaos, failover, stall, freeze, outage,
## browser or bench smoke (make test runs them all); the root package's tests, which mostly wait on
## timers and the database, in CHECK_SHARDS processes at once, each with its own PostgreSQL
CHECK_SHARDS ?= 3
check: check-postgres vet
	$(TESTTIMES) -check -shards $(CHECK_SHARDS) -json $(TESTS_JSON)

## slowest: the 20 slowest tests of the last make check or make test (its go test -json, TESTS_JSON)
slowest:
	@$(TESTTIMES) -slowest 20 $(TESTS_JSON)

# The last run's go test -json (make slowest reads it), and the filter that prints what go test
# prints without -v and fails when a test did.
TESTS_JSON ?= $${TMPDIR:-/tmp}/sqlstreams-tests.json
TESTTIMES = $(GO) run ./internal/testtimes

## demo: produce and consume on a local PostgreSQL (SQLSTREAMS_DATABASE_URL, or a private one)
demo: check-postgres
	$(GO) run ./cmd/sqlstreams demo

## chaos: the chaos run for DURATION at RATE msg/s offered (make chaos DURATION=30m; RATE=0 is
## unthrottled), then the exactly-once run of transactional handlers over EXACTLY_ONCE messages (20,000)
## under kills, freezes, terminated backends and PostgreSQL restarts; make test runs a 45 s chaos run
## and 2,000 messages
EXACTLY_ONCE ?= 20000
chaos: check-postgres
	SQLSTREAMS_CHAOS=$(DURATION) SQLSTREAMS_CHAOS_RATE=$(RATE) $(GO) test -race -count=1 -run '^TestChaos$$' -v -timeout 0 .
	SQLSTREAMS_EXACTLY_ONCE=$(EXACTLY_ONCE) $(GO) test -race -count=1 -run '^TestExactlyOnceUnderFaults$$' -v -timeout 0 .

## failover: the synchronous-failover test REPEAT times in a row (issue 23's acceptance is 10; make test
## runs it once); the automated failover with pg_auto_failover (skipped where postgresql-15-auto-failover
## is not installed); then the failover chaos run: a failover every FAILOVER_EVERY for FAILOVER_CHAOS,
## each followed by a new synchronous standby
REPEAT ?= 10
FAILOVER_CHAOS ?= 2m
FAILOVER_EVERY ?= 15s
failover: check-postgres
	$(GO) test -race -count=$(REPEAT) -run '^TestSynchronousFailoverLosesNothing$$' -v -timeout 0 .
	SQLSTREAMS_FAILOVER_AUTO=1 $(GO) test -race -count=1 -run '^TestAutomatedFailoverLosesNothing$$' -v -timeout 0 .
	SQLSTREAMS_FAILOVER_CHAOS=$(FAILOVER_CHAOS) SQLSTREAMS_FAILOVER_EVERY=$(FAILOVER_EVERY) \
		$(GO) test -race -count=1 -run '^TestFailoverChaos$$' -v -timeout 0 .

## sim: the simulator's random runs for SEEDS seeds (default 200; make sim SEEDS=1000); make test runs 50
sim: check-postgres
	SQLSTREAMS_SIM_SEEDS=$(or $(SEEDS),200) $(GO) test -race -count=1 -run '^TestRandomSeeds$$' -timeout 0 ./sim

## freeze: the freeze test's long schedule for SEEDS random seeds (default 5; each printed, and
## SQLSTREAMS_FREEZE_SEED=<seed> replays one): 3 consumer processes, 200 msg/s for 60 s on 20 hot keys,
## InstanceTTL 3 s, three SIGSTOPs of 7.5 s; once with exclusive keys, once with ordered (about 2 min a
## seed). Built without the race detector, as an application is: at this rate on two cores it slows
## the processes past what the schedule measures; make test runs a one-minute schedule under -race
freeze: check-postgres
	SQLSTREAMS_FREEZE_SEEDS=$(or $(SEEDS),5) $(GO) test -count=1 -run '^TestFreezesAtScaleLong$$' -v -timeout 0 .

## bench: every workload on 1,000,000-message backlogs, as issue 8 sets them (under 30 min; River and
## Watermill each time the first 100,000 of their 1,000,000 backlog; NATS JetStream and RabbitMQ, where
## they answer, 100,000 messages as reference points; BENCHMARKS.md, Method); writes bench/results/latest.*
bench: check-postgres
	cd bench && $(GO) run . -n 1000000 -peer-n 100000 -ref-n 100000 $(BENCHFLAGS)

## bench-200k: every workload on 200,000-message backlogs (about 12 min)
bench-200k: check-postgres
	cd bench && $(GO) run . $(BENCHFLAGS)

## bench-1m: as bench, but the peers drain their whole 1,000,000 backlog (about an hour: they are slow at that size)
bench-1m: check-postgres
	cd bench && $(GO) run . -n 1000000 $(BENCHFLAGS)

## bench-capacity: the capacity scenarios behind docs/scaling.md: per message, server and client CPU, WAL
## bytes and fsyncs, connections, as instances, groups, streams and retained rows grow, and idle sessions'
## cost (3 runs of 10 windows; writes bench/results/capacity/latest.*)
bench-capacity: check-postgres
	cd bench && $(GO) run . -only capacity -runs 3 -results results/capacity $(BENCHFLAGS)

## bench-scale: many streams and groups (issue 22): registering 1,000 streams and 2,000 groups (time,
## catalog), 2,000 idle sessions over 4 processes for 60 s (server CPU), 200,000 messages produced and
## burnt down over 1,000 streams against one stream, by running sessions and by sessions starting on
## the backlog (decision 0041; 3 runs; writes bench/results/scale/latest.*). Its private cluster has a
## 1 GB pool, so that both sides' backlog fits (decision 0041; -shared-buffers 256MB in BENCHFLAGS shows the cliff)
bench-scale: check-postgres
	cd bench && $(GO) run . -only scale -runs 3 -shared-buffers 1GB -results results/scale $(BENCHFLAGS)

## bench-quick: every PostgreSQL workload at toy sizes (about 45 s; not the NATS and RabbitMQ reference
## points, so that CI needs no server but PostgreSQL; PgQ is skipped with a note unless Debian's
## postgresql-15-pgq3 is installed); results go to a temp dir, figures mean nothing
bench-quick: check-postgres
	cd bench && $(GO) run . -n 5000 -runs 1 -singles 500 -latency-for 2s -keysn 2000 -growth 20000 -growth-n 5000 \
		-capacity-rate 50 -capacity-window 1s -capacity-retained 20000 -capacity-streams 8 \
		-scale-streams 20 -scale-groups 2 -scale-n 2000 -scale-idle 2s \
		-only raw,produce,burndown,latency,fanout,selective,keys,growth,capacity,scale,river,watermill,pgq -results $${TMPDIR:-/tmp}/sqlstreams-bench-quick

# Fail at once, with the command that fixes it, when there is no PostgreSQL to use.
## check-chromium: the console's browser tests drive Debian's chromium (the system binary)
check-chromium:
	@if ! command -v chromium >/dev/null 2>&1; then \
	  echo "Chromium not found on PATH (the console's browser tests need it);"; \
	  echo "install it with: apt-get update && apt-get install -y chromium"; \
	  exit 1; \
	fi

check-postgres:
	@if [ -z "$$SQLSTREAMS_TEST_DATABASE_URL$$SQLSTREAMS_DATABASE_URL" ] && ! command -v initdb >/dev/null 2>&1 \
	    && ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then \
	  echo "PostgreSQL server binaries (initdb, pg_ctl) not found on PATH or under /usr/lib/postgresql/*/bin;"; \
	  echo "install them with: apt-get update && apt-get install -y postgresql"; \
	  exit 1; \
	fi
