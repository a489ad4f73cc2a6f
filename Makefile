# The test tiers (CONTRIBUTING.md; scripts/test.sh runs them all).
.PHONY: check test-pg test-etcd test lab bench deps test-deps

# gofmt, go vet of every module and every test that starts no server (the in-memory
# conformance suite and the deterministic simulation among them). Needs Go only: installs
# nothing, starts no server, runs as any user.
check:
	@scripts/test.sh check

# The tests that start PostgreSQL clusters (and PgBouncer, and pgtemp's Docker provider).
test-pg: test-deps
	@scripts/test.sh pg

# The tests that start etcd servers. etcd is built from Go modules: needs Go only.
test-etcd:
	@scripts/test.sh etcd

# Every test of every module, as CI runs it (.ci/run).
test: test-deps
	@scripts/test.sh all

# The lab: the conformance cases F1-F18, X1 and X2 on every backend configuration,
# evidence written to evidence/26/. Needs PostgreSQL's binaries, not Docker.
lab: deps
	@examples/lease-fencing/run.sh

# Side-by-side benchmark on a throwaway cluster and etcd; writes evidence/bench/latest.txt
# and the table in docs/performance.md. Not part of `make test`: timings are not tests.
bench: deps
	@cd examples/lease-fencing && go run ./cmd/bench -out ../../evidence/bench -lab ./run.sh -docs ../../docs/performance.md

# Capacity (docs/capacity.md): 10,000 holders x 100 names = 1,000,000 leases acquired through
# the public API, renewed at TTL/3 (TTL 15 s) for 60 s by 4 holder processes, on PostgreSQL per-lease,
# PostgreSQL holder sessions, one etcd member and a 3-member etcd cluster, one after the other; prints
# the RATIO lines and writes evidence/capacity/latest.txt (a full-scale run only). Not part of `make test`;
# needs a quiet machine. CAPACITY_FLAGS="-holders 200 -duration 20s" runs it small; CAPACITY_FLAGS="-slow-disk 1ms"
# puts the servers' data on a disk whose flushes take 1 ms longer (as root; evidence/capacity/slow-disk-1ms.txt).
.PHONY: capacity
capacity: deps
	@cd examples/lease-fencing && go run ./cmd/capacity -out ../../evidence/capacity $(CAPACITY_FLAGS)

# The torture run (docs/torture.md): 200 seeded fault histories per backend (PostgreSQL, etcd, a
# 3-member etcd cluster, three PostgreSQL members under Patroni), each checked (I2, I3, fence waits,
# final state, lost writes, porcupine), and the negative controls, which must be caught; the figures
# go to evidence/torture/latest.txt. SEED=<n> replays a run's schedules. `make test` runs a short one.
.PHONY: torture
torture: deps
	@scripts/ensure-deps.sh patroni
	@cd torture && go test -count=1 -timeout 90m -run '^TestTorture$$' -v . \
		-torture.histories=200 -torture.controls=5 -torture.lanes=3 \
		-torture.control-evidence=../evidence/torture/controls -torture.report=../evidence/torture/latest.txt \
		$(if $(SEED),-torture.seed=$(SEED))

# PostgreSQL's binaries (installed with apt-get when run as root). No Docker.
deps:
	@scripts/ensure-deps.sh

# What the PostgreSQL tests need besides: PgBouncer, Patroni and etcd's server program (F16 on
# Patroni), a Docker engine and the image pgtemp's
# Docker provider is tested with (installed and started when run as root;
# LEASEFENCE_SKIP_DOCKER=1 skips Docker). Only test and test-pg run it.
test-deps:
	@scripts/ensure-deps.sh pgbouncer patroni
	@scripts/ensure-docker.sh

# The flake hunt (scripts/flake-hunt.sh): each entry of scripts/flake-hunt.list (the tests whose
# outcome depends on time, order or the scheduler) run 20 times under -race beside two CPU burners;
# writes evidence/flakes/latest.txt and the failures' output under evidence/flakes/failures/.
# Hours for the whole list; FLAKE_ARGS="-n 5" or FLAKE_ARGS="-only leasecore" for less.
.PHONY: flake-hunt
flake-hunt:
	@scripts/ensure-deps.sh pgbouncer
	@scripts/flake-hunt.sh $(FLAKE_ARGS)
