# The two commands of the README. Both install what they need first.
.PHONY: test lab bench deps

# Every test of every module, against real PostgreSQL clusters started by the tests.
test: deps
	@scripts/test.sh

# The lab: F1-F9 on every backend, evidence written to evidence/26/.
lab: deps
	@examples/lease-fencing/run.sh

# Side-by-side benchmark on a throwaway cluster and etcd; writes evidence/bench/latest.txt
# and the table in docs/performance.md. Not part of `make test`: timings are not tests.
bench: deps
	@cd examples/lease-fencing && go run ./cmd/bench -out ../../evidence/bench -lab ./run.sh -docs ../../docs/performance.md

deps:
	@scripts/ensure-deps.sh
