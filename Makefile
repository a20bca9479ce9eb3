# The two commands of the README: `make demo` (the main job) and `make test`.
GO ?= go
SEEDS ?= 200

DURATION ?= 5m

.PHONY: test demo vet bench chaos sim check-postgres

## test: vet, then the whole suite with the race detector, on a private PostgreSQL
test: check-postgres vet
	$(GO) test -race -count=1 -timeout 15m ./...

vet:
	$(GO) vet ./...

## demo: produce and consume on a local PostgreSQL (SQLSTREAMS_DATABASE_URL, or a private one)
demo: check-postgres
	$(GO) run ./cmd/sqlstreams demo

## chaos: the chaos run for DURATION (make chaos DURATION=30m); make test runs a 45 s one
chaos: check-postgres
	SQLSTREAMS_CHAOS=$(DURATION) $(GO) test -race -count=1 -run '^TestChaos$$' -v -timeout 0 .

## sim: the simulator's random runs for SEEDS seeds (make sim SEEDS=1000); make test runs 50
sim: check-postgres
	SQLSTREAMS_SIM_SEEDS=$(SEEDS) $(GO) test -race -count=1 -run '^TestRandomSeeds$$' -timeout 0 ./sim

## bench: the benchmark harness (its own module); writes BENCHMARKS results
bench: check-postgres
	cd bench && $(GO) run . $(BENCHFLAGS)

# Fail at once, with the command that fixes it, when there is no PostgreSQL to use.
check-postgres:
	@if [ -z "$$SQLSTREAMS_TEST_DATABASE_URL$$SQLSTREAMS_DATABASE_URL" ] && ! command -v initdb >/dev/null 2>&1 \
	    && ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then \
	  echo "PostgreSQL server binaries (initdb, pg_ctl) not found on PATH or under /usr/lib/postgresql/*/bin;"; \
	  echo "install them with: apt-get update && apt-get install -y postgresql"; \
	  exit 1; \
	fi
