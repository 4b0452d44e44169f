#!/usr/bin/env bash
# Side-by-side benchmark of the subscription matcher: fieldgate vs mochi-mqtt
# vs the NATS sublist, on the host architecture and on 386 (the 32-bit
# stand-in for ARMv6/v7 gateways). Raw output goes to results/matcher-ARCH.txt
# and a Markdown summary to results/matcher-summary.md.
#
# Environment:
#   COUNT=3             repetitions of every benchmark (the table shows medians)
#   BENCHTIME=0.5s      -benchtime of every benchmark (a duration, or e.g. 40960x
#                       for ten passes over the 4096 topics)
#   BENCH_MAX_SUBS=N    skip workloads with more than N subscriptions (default 1000000)
#   BENCH=regexp        -bench pattern (default: every BenchmarkMatch row)
#   ARCHES="amd64 386"  GOARCH values to run (default: host arch, then 386)
#   BENCH_VERBOSE=1     print setup progress (workload generation, index builds); 0 or empty: quiet
set -euo pipefail

cd "$(dirname "$0")"
here=$(pwd)
results="$here/results"
mkdir -p "$results"

COUNT=${COUNT:-3}
BENCHTIME=${BENCHTIME:-0.5s}
BENCH=${BENCH:-^BenchmarkMatch$}
export BENCH_VERBOSE=${BENCH_VERBOSE:-1} # "# row: built in ..." progress lines
hostarch=$(go env GOHOSTARCH)
ARCHES=${ARCHES:-"$hostarch 386"}

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

cpu=$(grep -m1 '^model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2- | sed 's/^ *//' || true)
peers=$(go list -m -f '{{.Path}} {{.Version}}' github.com/mochi-mqtt/server/v2 github.com/nats-io/nats-server/v2 | paste -sd, - | sed 's/,/, /g')
echo "CPU:     ${cpu:-unknown} ($(nproc) cores)"
echo "Go:      $(go version)"
echo "Peers:   $peers"
echo "Arches:  $ARCHES; COUNT=$COUNT BENCHTIME=$BENCHTIME BENCH_MAX_SUBS=${BENCH_MAX_SUBS:-1000000}"

# can_run ARCH BINARY: whether this machine executes binaries built for ARCH.
can_run() {
	local arch=$1 bin=$2 err
	if err=$("$bin" -test.run '^$' 2>&1 >/dev/null); then
		return 0
	fi
	echo "cannot run GOARCH=$arch binaries here: ${err:-unknown error}" >&2
	case "$arch" in
	386)
		echo "  (running 32-bit x86 binaries needs an x86 CPU and a kernel built with" >&2
		echo "   CONFIG_IA32_EMULATION, not disabled with ia32_emulation=0 on its command line)" >&2
		;;
	esac
	return 1
}

status=0
raw=()
for arch in $ARCHES; do
	bin="$tmp/matcherbench-$arch.test"
	out="$results/matcher-$arch.txt"
	echo
	echo "== GOARCH=$arch: building"
	GOARCH=$arch go test -c -o "$bin" ./matcherbench
	if ! can_run "$arch" "$bin"; then
		status=1
		continue
	fi
	echo "== GOARCH=$arch: running (raw output: ${out#"$here/"})"
	start=$SECONDS
	# The test binary runs in the package directory, as go test would.
	if ! (cd matcherbench && "$bin" -test.run '^$' -test.bench "$BENCH" \
		-test.benchtime "$BENCHTIME" -test.count "$COUNT" -test.timeout 0) 2>&1 | tee "$out"; then
		echo "GOARCH=$arch: benchmark failed" >&2
		status=1
	fi
	echo "== GOARCH=$arch: $((SECONDS - start))s"
	raw+=("results/matcher-$arch.txt")
done

if [ ${#raw[@]} -eq 0 ]; then
	echo "no benchmark output" >&2
	exit 1
fi

echo
go run ./cmd/benchtable -o "$results/matcher-summary.md" -go "$(go env GOVERSION)" -peers "$peers" "${raw[@]}"
echo
echo "summary written to ${results#"$here/"}/matcher-summary.md"
exit $status
