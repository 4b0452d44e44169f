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
#
# Mosquitto comes from Debian's package; as root the script installs it
# when missing. A broker that does not answer CONNACK within a few seconds
# is skipped with a "# skip" line saying why, and the rest still run.
set -euo pipefail

cd "$(dirname "$0")"
here=$(pwd)
root=$(cd ../.. && pwd)
results="$here/results"
mkdir -p "$results"

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
arch=$(go env GOHOSTARCH)
# A smoke run keeps its results apart, so as not to replace a full run's.
name=broker
if [ "${QUICK:-0}" = 1 ]; then name=broker-quick; fi
raw="$results/$name-$arch.txt"
summary="$results/$name-summary.md"

# Two runs at once would share the ports, the cores and the result files.
lock="${TMPDIR:-/tmp}/fieldgate-bench-broker.lock"
exec 9>"$lock"
if ! flock -n 9; then
	echo "waiting for another bench-broker.sh run to finish ($lock)" >&2
	flock 9
fi

tmp=$(mktemp -d)
pids=()
cleanup() {
	local pid
	for pid in "${pids[@]}"; do
		if kill -0 "$pid" 2>/dev/null; then
			kill -KILL "$pid" 2>/dev/null || true
			wait "$pid" 2>/dev/null || true
		fi
	done
	if [ "${KEEP_LOGS:-0}" = 1 ]; then
		echo "broker logs and configs kept in $tmp" >&2
	else
		rm -rf "$tmp"
	fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Each idle connection is a socket in the broker and one in the generator.
if ! ulimit -n 65536 2>/dev/null; then
	ulimit -n "$(ulimit -Hn)"
	echo "note: open-file limit is $(ulimit -n) (raising it to 65536 is not permitted here)" >&2
fi

echo "== building"
load="$tmp/brokerload"
go build -o "$load" ./cmd/brokerload
go build -o "$tmp/mochiserver" ./cmd/mochiserver

declare -A skip=() # broker -> why it cannot run at all
declare -A port=([fieldgate]=$((PORT + 1)) [mochi]=$((PORT + 2)) [mosquitto]=$((PORT + 3)))

fieldgate_version=unknown
if [[ " $BROKERS " == *" fieldgate "* ]]; then
	if out=$(make -C "$root" --no-print-directory build 2>&1); then
		fieldgate_version=$("$root/bin/fieldgate" version 2>/dev/null | paste -sd' ' - || true)
	else
		echo "$out" >&2
		skip[fieldgate]="make build failed: $(grep -m1 -E 'error|\.go:[0-9]+' <<<"$out" || echo "$out" | tail -1)"
	fi
fi

mosquitto_bin=
mosquitto_version=unknown
if [[ " $BROKERS " == *" mosquitto "* ]]; then
	mosquitto_bin=$(PATH="$PATH:/usr/sbin:/usr/local/sbin" command -v mosquitto || true)
	if [ -z "$mosquitto_bin" ] && [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
		echo "== installing mosquitto"
		export DEBIAN_FRONTEND=noninteractive
		apt-get install -y mosquitto >/dev/null || { apt-get update >/dev/null && apt-get install -y mosquitto >/dev/null; } || true
		mosquitto_bin=$(PATH="$PATH:/usr/sbin:/usr/local/sbin" command -v mosquitto || true)
		# The package starts a service on port 1883 where an init system
		# runs; it would take CPU from the broker under test.
		if command -v systemctl >/dev/null && [ -d /run/systemd/system ]; then
			systemctl stop mosquitto 2>/dev/null || true
		fi
	fi
	if [ -z "$mosquitto_bin" ]; then
		skip[mosquitto]="not installed (sudo apt-get install -y mosquitto)"
	else
		mosquitto_version=$({ "$mosquitto_bin" -h 2>/dev/null || true; } | sed -n "s/^mosquitto version //p" | head -1)
		deb=$(dpkg-query -W -f '${Version}' mosquitto 2>/dev/null || true)
		mosquitto_version="${mosquitto_version:-unknown}${deb:+ (Debian package $deb)}"
	fi
fi

cpu=$(grep -m1 '^model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2- | sed 's/^ *//' || true)
mochi=$(go list -m -f '{{.Path}} {{.Version}}' github.com/mochi-mqtt/server/v2)
settings="COUNT=$COUNT DURATION=$DURATION LATENCY_DURATION=$LATENCY_DURATION WARMUP=$WARMUP CONNS=$CONNS SUBS=$SUBS over $SUBCONNS connections, FANOUT=$FANOUT, RATE=$RATE/s, PAYLOAD=$PAYLOAD B"
{
	echo "cpu: ${cpu:-unknown}"
	echo "cores: $(nproc)"
	echo "goos: $(go env GOHOSTOS)"
	echo "goarch: $arch"
	echo "go: $(go env GOVERSION)"
	echo "fieldgate: $fieldgate_version"
	echo "mochi: $mochi"
	echo "mosquitto: $mosquitto_version"
	echo "settings: $settings"
	echo "date: $(date -u +%Y-%m-%dT%H:%MZ)"
	# Anything else running shares the cores with broker and generator.
	echo "loadavg-start: $(cut -d' ' -f1-3 /proc/loadavg)"
	for b in $BROKERS; do
		if [ -n "${skip[$b]:-}" ]; then echo "# skip $b: ${skip[$b]}"; fi
	done
} | tee "$raw"

# port_busy PORT: whether something already listens on 127.0.0.1:PORT.
port_busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

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
		cat >"$dir/fieldgate.yaml" <<-EOF
			broker:
			  allow_anonymous: true
			  max_subscriptions: 2000
			  sys_interval: 1s
			listeners:
			  - name: bench
			    type: tcp
			    address: 127.0.0.1:$p
			ops:
			  address: ""
			sensors: []
			storage:
			  path: $dir/state.db
		EOF
		"$root/bin/fieldgate" run -config "$dir/fieldgate.yaml" >"$blog" 2>&1 &
		;;
	mochi)
		"$tmp/mochiserver" -addr "127.0.0.1:$p" >"$blog" 2>&1 &
		;;
	mosquitto)
		cat >"$dir/mosquitto.conf" <<-EOF
			listener $p 127.0.0.1
			allow_anonymous true
			persistence false
			max_queued_messages 1000
			sys_interval 1
			log_dest stderr
			log_type error
			log_type warning
			connection_messages false
		EOF
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

# log_tail FILE: the last lines of a broker log, as comments.
log_tail() { tail -n 5 "$1" 2>/dev/null | sed 's/^/#     /'; }

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

status=0
start=$SECONDS
for rep in $(seq "$COUNT"); do
	for b in $BROKERS; do
		for g in "${groups[@]}"; do
			[ -n "${skip[$b]:-}" ] && continue
			echo "== run $rep/$COUNT: $b: $g" >&2
			if port_busy "${port[$b]}"; then
				skip[$b]="port ${port[$b]} is already in use by another process"
				echo "# skip $b: ${skip[$b]}" | tee -a "$raw"
				continue
			fi
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
				echo "# warn $b/$g: the broker exited (status $code) during the run; its log ends:" | tee -a "$raw"
				log_tail "$blog" | tee -a "$raw"
			fi
			stop_broker "$bpid"
			case $rc in
			0) ;;
			3)
				# The "# skip" line is in the raw output; later runs would only repeat it.
				skip[$b]="no CONNACK"
				echo "   $b did not answer; its log ends:" >&2
				log_tail "$blog" >&2
				;;
			*) status=1 ;;
			esac
		done
	done
done
echo "loadavg-end: $(cut -d' ' -f1-3 /proc/loadavg)" >>"$raw"
echo "== runs took $((SECONDS - start))s; raw output: ${raw#"$here/"}" >&2

echo
"$load" summary -o "$summary" "${raw#"$here/"}"
echo
echo "summary written to ${summary#"$here/"}"
exit $status
