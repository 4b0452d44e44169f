#!/usr/bin/env bash
# Side-by-side benchmark of the subscription matcher: fieldgate vs mochi-mqtt
# vs the NATS sublist, on the host architecture and on 386 (the 32-bit
# stand-in for ARMv6/v7 gateways). Raw output goes to results/matcher-ARCH.txt
# and a Markdown summary to results/matcher-summary.md, which is printed;
# QUICK=1 writes results/matcher-quick-* instead.
#
# Environment:
#   QUICK=1             smoke run, about a minute: COUNT=1 BENCHTIME=0.1s BENCH_MAX_SUBS=100000
#                       and the w10% distinct d5 rows only (each can still be set)
#   COUNT=3             repetitions of every benchmark (the table shows medians)
#   BENCHTIME=0.5s      -benchtime of every benchmark (a duration, or e.g. 40960x
#                       for ten passes over the 4096 topics)
#   BENCH_MAX_SUBS=N    skip workloads with more than N subscriptions (default 1000000)
#   BENCH=regexp        -bench pattern (default: every BenchmarkMatch row)
#   ARCHES="amd64 386"  GOARCH values to run (default: host arch, then 386)
#   BENCH_VERBOSE=1     print setup progress (workload generation, index builds); 0 or empty: quiet
set -euo pipefail

cd "$(dirname "$0")"
. ./lib.sh

name=matcher
if [ "${QUICK:-0}" = 1 ]; then
	COUNT=${COUNT:-1} BENCHTIME=${BENCHTIME:-0.1s}
	BENCH=${BENCH:-'^BenchmarkMatch$/impl=/subs=/wild=10/prefix=distinct/depth=5/'}
	export BENCH_MAX_SUBS=${BENCH_MAX_SUBS:-100000}
	name+=-quick
fi
COUNT=${COUNT:-3}
BENCHTIME=${BENCHTIME:-0.5s}
BENCH=${BENCH:-^BenchmarkMatch$}
export BENCH_VERBOSE=${BENCH_VERBOSE:-1} # "# row: built in ..." progress lines
ARCHES=${ARCHES:-"$arch 386"}
summary="$results/$name-summary.md"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# describe: the header of every raw file, which the summary reads: the
# date, Go and the peers' versions.
describe() {
	echo "date: $(date -u +%Y-%m-%dT%H:%MZ)"
	echo "go: $(go env GOVERSION)"
	describe_module mochi github.com/mochi-mqtt/server/v2
	describe_module nats github.com/nats-io/nats-server/v2
}
describe_machine | grep -E '^(cpu|cores|go):'
echo "arches: $ARCHES; COUNT=$COUNT BENCHTIME=$BENCHTIME BENCH_MAX_SUBS=${BENCH_MAX_SUBS:-1000000}"

# can_run ARCH BINARY: whether this machine executes binaries built for ARCH.
can_run() {
	local a=$1 bin=$2 err
	if err=$("$bin" -test.run '^$' 2>&1 >/dev/null); then
		return 0
	fi
	echo "cannot run GOARCH=$a binaries here: ${err:-unknown error}" >&2
	case "$a" in
	386)
		echo "  (running 32-bit x86 binaries needs an x86 CPU and a kernel built with" >&2
		echo "   CONFIG_IA32_EMULATION, not disabled with ia32_emulation=0 on its command line)" >&2
		;;
	esac
	return 1
}

raws=()
for a in $ARCHES; do
	bin="$tmp/matcherbench-$a.test"
	out="$results/$name-$a.txt"
	echo
	echo "== GOARCH=$a: building"
	GOARCH=$a go test -c -o "$bin" ./matcherbench
	if ! can_run "$a" "$bin"; then
		status=1
		continue
	fi
	echo "== GOARCH=$a: running (raw output: ${out#"$here/"})"
	start=$SECONDS
	describe >"$out"
	# The test binary runs in the package directory, as go test would.
	if ! (cd matcherbench && "$bin" -test.run '^$' -test.bench "$BENCH" \
		-test.benchtime "$BENCHTIME" -test.count "$COUNT" -test.timeout 0) 2>&1 | tee -a "$out"; then
		echo "GOARCH=$a: benchmark failed" >&2
		status=1
	fi
	echo "== GOARCH=$a: $((SECONDS - start))s"
	raws+=("${out#"$here/"}")
done

if [ ${#raws[@]} -eq 0 ]; then
	echo "no benchmark output" >&2
	exit 1
fi

echo
go run ./cmd/benchreport summary -o "$summary" matcher "${raws[@]}"
echo
echo "summary written to ${summary#"$here/"}"
exit $status
