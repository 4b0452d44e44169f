#!/usr/bin/env bash
# Side-by-side benchmark of MQTT brokers over TCP: fieldgate's broker, the
# full mochi-mqtt server (cmd/mochiserver) and Mosquitto, one at a time on
# this machine, each started fresh by this script on a loopback port of its
# own and driven by the same load generator (cmd/brokerload, package
# brokerbench). Raw output goes to results/broker-ARCH.txt (Go benchmark
# lines, readable by benchstat) and a Markdown summary with medians, ratios
# and fieldgate's targets to results/broker-summary.md, which is printed.
# QUICK=1 writes results/broker-quick-ARCH.txt and broker-quick-summary.md
# instead, leaving a full run's results in place.
#
# Every repetition starts each broker three times: once for the throughput
# and latency scenarios, and afresh for each memory scenario, whose baseline
# must be a broker that has not yet served any load.
#
# Environment:
#   QUICK=1             smoke run, under a minute: COUNT=1 DURATION=2s WARMUP=0.25s
#                       LATENCY_DURATION=1s CONNS=1000 SUBS=10000 SETTLE=1s (each can
#                       still be set)
#   COUNT=3             repetitions (the summary shows medians)
#   DURATION=5s         measured interval of the throughput scenarios
#   LATENCY_DURATION    measured interval of the latency scenarios (default DURATION)
#   WARMUP=1s           load before measuring
#   SETTLE=2s           memory scenarios: wait after connecting before reading the figures
#   CONNS=10000         idle connections, five subscriptions each
#   SUBS=100000         subscriptions of the subscription scenario, over SUBCONNS=100 connections
#   RATE=1000           latency scenario: messages per second, all publishers together
#   PAYLOAD=64          message payload in bytes
#   FANOUT=1000         subscribers of the fan-out scenario
#   BROKERS="fieldgate mochi mosquitto"
#   SCENARIOS="throughput latency idle subs"
#   PORT=18830          brokers listen on 127.0.0.1:PORT+1 (fieldgate), +2 (mochi), +3 (mosquitto)
#   KEEP_LOGS=1         keep the brokers' logs and configs (the path is printed)
#   RESULTS_NAME=broker write results/RESULTS_NAME-ARCH.txt and RESULTS_NAME-summary.md
#                       (bench-all.sh's sweeps use sweep-..., leaving the broker's own in place)
#
# Mosquitto comes from Debian's package; as root the script installs it
# when missing. A broker that does not answer CONNACK within a few seconds
# is skipped with a "# skip" line saying why, and the rest still run.
set -euo pipefail

cd "$(dirname "$0")"
. ./lib.sh

if [ "${QUICK:-0}" = 1 ]; then
	COUNT=${COUNT:-1} DURATION=${DURATION:-2s} WARMUP=${WARMUP:-0.25s}
	LATENCY_DURATION=${LATENCY_DURATION:-1s}
	CONNS=${CONNS:-1000} SUBS=${SUBS:-10000}
	SETTLE=${SETTLE:-1s}
fi
COUNT=${COUNT:-3}
DURATION=${DURATION:-5s}
LATENCY_DURATION=${LATENCY_DURATION:-$DURATION}
WARMUP=${WARMUP:-1s}
CONNS=${CONNS:-10000}
SUBS=${SUBS:-100000}
SUBCONNS=${SUBCONNS:-100}
RATE=${RATE:-1000}
PAYLOAD=${PAYLOAD:-64}
FANOUT=${FANOUT:-1000}
SETTLE=${SETTLE:-2s}
BROKERS=${BROKERS:-"fieldgate mochi mosquitto"}
SCENARIOS=${SCENARIOS:-"throughput latency idle subs"}
PORT=${PORT:-18830}
# A smoke run keeps its results apart, so as not to replace a full run's.
result_files "${RESULTS_NAME:-broker}"

take_bench_lock "waiting for another bench-broker.sh run to finish"

tmp=$(mktemp -d)
kill_on_exit "broker logs and configs"

# Each idle connection is a socket in the broker and one in the generator.
if ! ulimit -n 65536 2>/dev/null; then
	ulimit -n "$(ulimit -Hn)"
	echo "note: open-file limit is $(ulimit -n) (raising it to 65536 is not permitted here)" >&2
fi

build_tools
assign_ports "$PORT"
build_fieldgate
find_mosquitto

settings="COUNT=$COUNT DURATION=$DURATION LATENCY_DURATION=$LATENCY_DURATION WARMUP=$WARMUP CONNS=$CONNS SUBS=$SUBS over $SUBCONNS connections, FANOUT=$FANOUT, RATE=$RATE/s, PAYLOAD=$PAYLOAD B"
{
	describe_machine
	echo "fieldgate: $fieldgate_version"
	describe_module mochi github.com/mochi-mqtt/server/v2
	echo "mosquitto: $mosquitto_version"
	describe_run "$settings"
} | tee "$raw"

starts=0
# start_broker NAME: starts NAME on its port, setting bpid and blog.
start_broker() {
	local name=$1 p=${port[$1]} dir
	starts=$((starts + 1))
	dir="$tmp/$name-$starts"
	mkdir -p "$dir"
	blog="$dir/log"
	case $name in
	fieldgate)
		fieldgate_config "$dir" "$p" "max_subscriptions: 2000" "sys_interval: 1s"
		"$root/bin/fieldgate" run -config "$dir/fieldgate.yaml" >"$blog" 2>&1 &
		;;
	mochi)
		"$tmp/mochiserver" -addr "127.0.0.1:$p" >"$blog" 2>&1 &
		;;
	mosquitto)
		mosquitto_config "$dir/mosquitto.conf" "$p" "persistence false" "max_queued_messages 1000" \
			"sys_interval 1" "connection_messages false"
		"$mosquitto_bin" -c "$dir/mosquitto.conf" >"$blog" 2>&1 &
		;;
	*)
		echo "unknown broker $name" >&2
		return 1
		;;
	esac
	bpid=$!
	pids+=("$bpid")
}

# stop_broker PID: SIGTERM, then SIGKILL after five seconds.
stop_broker() {
	local pid=$1 i
	kill -TERM "$pid" 2>/dev/null || true
	for i in $(seq 50); do
		kill -0 "$pid" 2>/dev/null || break
		sleep 0.1
	done
	kill -KILL "$pid" 2>/dev/null || true
	wait "$pid" 2>/dev/null || true
}

# Throughput and latency share a broker start; each memory scenario gets a
# fresh one.
groups=()
shared=
for g in throughput latency; do
	if [[ " $SCENARIOS " == *" $g "* ]]; then shared+="$g,"; fi
done
if [ -n "$shared" ]; then groups+=("${shared%,}"); fi
for g in idle subs; do
	if [[ " $SCENARIOS " == *" $g "* ]]; then groups+=("$g"); fi
done
if [ ${#groups[@]} -eq 0 ]; then
	echo "SCENARIOS=\"$SCENARIOS\" names none of: throughput latency idle subs" >&2
	exit 2
fi

start=$SECONDS
for rep in $(seq "$COUNT"); do
	for b in $BROKERS; do
		for g in "${groups[@]}"; do
			[ -n "${skip[$b]:-}" ] && continue
			echo "== run $rep/$COUNT: $b: $g" >&2
			if port_taken "$b"; then continue; fi
			start_broker "$b"
			set +e
			"$load" run -broker "$b" -addr "127.0.0.1:${port[$b]}" -pid "$bpid" -scenarios "$g" \
				-warmup "$WARMUP" -duration "$DURATION" -latency-duration "$LATENCY_DURATION" \
				-payload "$PAYLOAD" -rate "$RATE" -fanout "$FANOUT" -settle "$SETTLE" \
				-conns "$CONNS" -subs "$SUBS" -subconns "$SUBCONNS" | tee -a "$raw"
			rc=${PIPESTATUS[0]}
			set -e
			if ! kill -0 "$bpid" 2>/dev/null; then
				wait "$bpid" 2>/dev/null && code=0 || code=$?
				broker_exited "$b/$g" " (status $code)" "$blog"
			fi
			stop_broker "$bpid"
			check_load "$b" "$rc" "$blog"
		done
	done
done
summarize "$start" broker
exit $status
