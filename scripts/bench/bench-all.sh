#!/usr/bin/env bash
# Every side-by-side benchmark in one go, one part after the other on this
# machine, then the report: docs/BENCHMARKS.md, with its plots in
# docs/bench/*.svg, written by cmd/benchreport from the results files.
# `make bench` runs this script.
#
# Parts, in order, and what they take on 2 cores in a full run (COUNT=3;
# the scripts' last full runs, the sweeps and the bridge estimated from
# their quick runs):
#   matcher    bench-matcher.sh, amd64 then 386 (building the 1M-subscription
#              indexes is most of it)                                    ~19 min
#   broker     bench-broker.sh                                            ~7 min
#   sweeps     bench-broker.sh's memory scenarios (SCENARIOS="idle subs")
#              at more sizes, for the plots against the number of
#              subscriptions and connections: results/sweep-*-ARCH.txt  ~4 min
#   storage    bench-storage.sh                                           ~7 min
#   bridge     bench-bridge.sh without its paced run (PACED_RATE below) ~2.5 min
#   footprint  bench-footprint.sh, when there is one                  ~5 min
#   idle       bench-idle.sh: six gateways at rest for 5 min at once, one
#              run whatever COUNT (QUICK=1: 30 s)                       ~6 min
#   report     cmd/benchreport                                          seconds
# About 40 minutes in all, 51 with the footprint and idle. Each part runs with its
# script's own settings; only COUNT (and QUICK) is passed to every one. A
# part that fails does not stop the others; the report says what is
# missing, and the script exits 1.
#
# The record of the run (machine, Go and peer versions, settings, the time
# of each part) goes to results/bench-all.txt, which the report opens with;
# a QUICK=1 run writes results/bench-all-quick.txt and reads only the
# scripts' quick results (results/*-quick-*), and its report says loudly at
# the top that it is a smoke run.
#
# Environment:
#   QUICK=1        smoke run of the whole pipeline, 6 to 7 minutes: QUICK=1 for every
#                  script (the matcher's: 1k and 100k subscriptions, w10% distinct d5,
#                  0.1 s per row), into results/*-quick-*
#   COUNT=3        repetitions of every part (the report shows medians; QUICK=1: 1)
#   PARTS="matcher broker sweeps storage bridge footprint idle"
#                  the parts to run; the report is written after them from whatever
#                  results there are. PARTS= (empty) only writes the report again.
#   SWEEP_CONNS="1000 2500 5000"  idle connections of the sweeps (the broker part adds
#                  its CONNS, 10000; QUICK=1: "2500 5000", the broker part 1000)
#   SWEEP_SUBS="1000 10000"       subscriptions of the sweeps (the broker part adds its
#                  SUBS, 100000; QUICK=1: "1000 100000", the broker part 10000)
#   PACED_RATE=0   the bridge's paced run, whose drain rate is the pace by construction;
#                  500 (bench-bridge.sh's default) adds it: 3.5 more minutes
#   REPORT         the report (default: docs/BENCHMARKS.md in the repository); the
#                  plots go to bench/ beside it
# The scripts' other knobs pass through (DURATION, BENCHTIME, STATE_DIR, ...);
# CONNS and SUBS set the sizes of the broker part (and of the footprint's
# heap step), not the sweeps'.
set -euo pipefail

cd "$(dirname "$0")"
. ./lib.sh

QUICK=${QUICK:-0}
if [ "$QUICK" = 1 ]; then
	SWEEP_CONNS=${SWEEP_CONNS-"2500 5000"}
	SWEEP_SUBS=${SWEEP_SUBS-"1000 100000"}
	mode="quick (QUICK=1)"
	record="$results/bench-all-quick.txt"
else
	QUICK=0
	COUNT=${COUNT:-3}
	SWEEP_CONNS=${SWEEP_CONNS-"1000 2500 5000"}
	SWEEP_SUBS=${SWEEP_SUBS-"1000 10000"}
	mode="full"
	record="$results/bench-all.txt"
fi
export QUICK
if [ -n "${COUNT:-}" ]; then export COUNT; fi
PARTS=${PARTS-"matcher broker sweeps storage bridge footprint idle"}
PACED_RATE=${PACED_RATE:-0}
REPORT=${REPORT:-$root/docs/BENCHMARKS.md}

for p in $PARTS; do
	case $p in
	matcher | broker | sweeps | storage | bridge | footprint | idle) ;;
	*)
		echo "PARTS=\"$PARTS\": no part $p (matcher broker sweeps storage bridge footprint idle)" >&2
		exit 2
		;;
	esac
done

# Two of these at once would share the cores and every results file.
lock="${TMPDIR:-/tmp}/fieldgate-bench-all.lock"
exec 8>"$lock"
if ! flock -n 8; then
	echo "waiting for another bench-all.sh run to finish ($lock)" >&2
	flock 8
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# The scripts exit 130 on an interrupt, which run_part would take for a
# failed part and go on to the next: stop here too.
trap 'exit 130' INT TERM

# wanted PART: whether PARTS names PART.
wanted() { [[ " $PARTS " == *" $1 "* ]]; }

# duration SECONDS: "19 min 12 s".
duration() {
	if [ "$1" -lt 60 ]; then echo "$1 s"; else printf '%d min %02d s\n' $(($1 / 60)) $(($1 % 60)); fi
}

# describe_all: machine, versions and settings, as "key: value" lines.
describe_all() {
	local mem os
	mem=$(awk '/^MemTotal:/ { printf "%.1f GiB", $2 / 1048576 }' /proc/meminfo 2>/dev/null || true)
	os=$(sed -n 's/^PRETTY_NAME="\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' /etc/os-release 2>/dev/null || true)
	echo "mode: $mode"
	echo "date: $(date -u +%Y-%m-%dT%H:%MZ)"
	echo "start: $(date +%s)"
	describe_machine
	echo "memory: ${mem:-unknown}"
	echo "kernel: $(uname -sr)"
	echo "os: ${os:-unknown}"
	echo "fieldgate: $(git -C "$root" describe --tags --always --dirty 2>/dev/null || echo unknown)"
	describe_module mochi github.com/mochi-mqtt/server/v2
	describe_module nats github.com/nats-io/nats-server/v2
	describe_module bbolt go.etcd.io/bbolt
	echo "mosquitto: $mosquitto_version"
	echo "settings: COUNT=${COUNT:-1} PARTS=\"$PARTS\" SWEEP_CONNS=\"$SWEEP_CONNS\" SWEEP_SUBS=\"$SWEEP_SUBS\" PACED_RATE=$PACED_RATE"
}

# part_sweeps: bench-broker.sh's memory scenarios once per size pair: the
# i-th of SWEEP_CONNS with the i-th of SWEEP_SUBS, so that one broker
# start per scenario and repetition covers both.
part_sweeps() {
	local -a conns subs
	local f q i n c s name scenarios rc=0
	read -ra conns <<<"$SWEEP_CONNS"
	read -ra subs <<<"$SWEEP_SUBS"
	n=$((${#conns[@]} > ${#subs[@]} ? ${#conns[@]} : ${#subs[@]}))
	# The points of an earlier run of this mode go: a size no longer swept
	# must not stay in the plots.
	for f in "$results"/sweep-*; do
		[ -e "$f" ] || continue
		if [[ $f == *-quick-* ]]; then q=1; else q=0; fi
		if [ "$q" = "$QUICK" ]; then rm -f "$f"; fi
	done
	for ((i = 0; i < n; i++)); do
		c=${conns[i]:-} s=${subs[i]:-}
		name=sweep scenarios=
		if [ -n "$c" ]; then name+="-conns$c" scenarios+=" idle"; fi
		if [ -n "$s" ]; then name+="-subs$s" scenarios+=" subs"; fi
		echo "== sweep: ${scenarios# } with CONNS=${c:-n/a} SUBS=${s:-n/a}"
		# The raw lines go to the results file; the summary of a sweep point
		# alone says nothing the report does not.
		RESULTS_NAME=$name SCENARIOS="${scenarios# }" CONNS=${c:-1000} SUBS=${s:-1000} \
			./bench-broker.sh >/dev/null || rc=1
		rm -f "$results/$name-summary.md" "$results/$name-quick-summary.md"
	done
	return $rc
}

part_footprint() {
	if [ -x bench-footprint.sh ]; then ./bench-footprint.sh; else bash ./bench-footprint.sh; fi
}
part_matcher() { ./bench-matcher.sh; }
part_broker() { ./bench-broker.sh; }
part_storage() { ./bench-storage.sh; }
part_bridge() { PACED_RATE=$PACED_RATE ./bench-bridge.sh; }
part_idle() { ./bench-idle.sh; }

failed=()
timings=()
# run_part NAME: runs part_NAME, timing it, and notes how it went in the
# record and in timings.
run_part() {
	local name=$1 start=$SECONDS rc=0 status=ok took
	echo
	echo "==== $name"
	# The parts' brokers must not inherit the lock: one left running would
	# hold it.
	"part_$name" 8>&- || rc=$?
	took=$((SECONDS - start))
	if [ "$rc" -ne 0 ]; then
		status=failed
		failed+=("$name")
	fi
	echo "part: $name $status $took" >>"$record"
	timings+=("$(printf '%-10s %-7s %s' "$name" "$status" "$(duration "$took")")")
	echo "==== $name: $status after $(duration "$took")"
}

all_start=$SECONDS
if [ -n "${PARTS// /}" ]; then
	declare -A skip=()
	BROKERS=mosquitto find_mosquitto
	describe_all | tee "$record"
	for p in $PARTS; do
		if [ "$p" = footprint ] && [ ! -f bench-footprint.sh ]; then
			echo "part: footprint skipped 0" >>"$record"
			timings+=("$(printf '%-10s %-7s %s' footprint skipped "no bench-footprint.sh")")
			continue
		fi
		run_part "$p"
	done
	echo "elapsed: $((SECONDS - all_start))" >>"$record"
fi

echo
echo "==== report"
args=(-results results -o "$REPORT" -svg "$(dirname "$REPORT")/bench" -arch "$arch")
if [ "$QUICK" = 1 ]; then args+=(-quick); fi
report_ok=1
go run ./cmd/benchreport report "${args[@]}" || report_ok=0

echo
echo "==== bench-all ($mode) took $(duration $((SECONDS - all_start)))"
for t in "${timings[@]}"; do echo "  $t"; done
if [ "$report_ok" = 0 ]; then failed+=(report); fi
if [ ${#failed[@]} -gt 0 ]; then
	echo "failed: ${failed[*]}" >&2
	exit 1
fi
