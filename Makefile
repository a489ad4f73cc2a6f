# The two commands of the README. Both install what they need first.
.PHONY: test lab deps

# Every test of every module, against real PostgreSQL clusters started by the tests.
test: deps
	@scripts/test.sh

# The lab: F1-F9 on every backend, evidence written to evidence/26/.
lab: deps
	@examples/lease-fencing/run.sh

deps:
	@scripts/ensure-deps.sh
