#!/usr/bin/env bash
# What fieldgate costs at rest: the CPU time of a gateway that is running,
# ready and connected upstream, with no client traffic, over DURATION.
#
# Each configuration of CONFIGS runs the release build of `make build`
# (bin/fieldgate) with its own ports and state file, all at the same time:
#   default               the embedded default configuration (gateway/config/
#                         default.yaml: six simulated sensors, the broker, the
#                         ops endpoint) and a bridge connected to a local
#                         Mosquitto, with an out-route (bench/idle/#) that
#                         nothing publishes to: a bridge with no traffic
#   default-forwarding    the same with the bridge carrying the readings,
#                         fieldgate/# at QoS 1
#   default-nobridge      the same without a bridge
#   sensors50             the default with its sensors replaced by 50 on the
#                         simulated hardware: twelve each of the BME280, SHT3x,
#                         ADS1115 and INA219, every SENSOR_INTERVAL, and the
#                         door and the water meter as in the default; with
#                         the bridge of default
#   sensors50-forwarding  and with the bridge carrying the readings
#   sensors50-nobridge    and without a bridge
# cmd/footprint idle waits until each is ready and its bridge up, leaves it
# alone for SETTLE (start-up: discovery, first readings, the first
# collections), then reads utime and stime from /proc/PID/stat, and again
# DURATION later, with the threads' wake-ups (schedstat) and context
# switches; /metrics is read only before and after, so that nothing but
# the gateway's own timers and the simulated hardware wakes it. A bridge
# that drops during the measurement fails the run.
#
# The target (scripts/bench/targets/targets.go): at most 0.2 % of one core
# for default and sensors50, a gateway at rest with its bridge connected;
# the others show what forwarding the readings, and the bridge, cost. Raw output goes to results/idle-ARCH.txt and the summary to
# results/idle-summary.md, which is printed; QUICK=1 writes
# results/idle-quick-* instead.
#
# Environment:
#   QUICK=1              smoke run: DURATION=30s SETTLE=10s (each can still be set)
#   DURATION=5m          how long each gateway is measured
#   SETTLE=30s           how long each is left alone once ready before that
#   CONFIGS="default default-forwarding default-nobridge sensors50 sensors50-forwarding sensors50-nobridge"
#   SENSOR_INTERVAL=60s  interval of the 48 simulated I²C sensors of sensors50: about
#                        the readings a second of the default (0.8 against 0.5)
#   READY_TIMEOUT=90s    how long a gateway may take to be ready with its bridge up
#   PORT=18940           the upstream listens on PORT, the n-th configuration on MQTT
#                        PORT+2n-1 and ops PORT+2n
#   KEEP_LOGS=1          keep the configurations, logs and state (the path is printed)
set -euo pipefail

cd "$(dirname "$0")"
. ./lib.sh

if [ "${QUICK:-0}" = 1 ]; then
	DURATION=${DURATION:-30s} SETTLE=${SETTLE:-10s}
fi
DURATION=${DURATION:-5m}
SETTLE=${SETTLE:-30s}
CONFIGS=${CONFIGS:-"default default-forwarding default-nobridge sensors50 sensors50-forwarding sensors50-nobridge"}
SENSOR_INTERVAL=${SENSOR_INTERVAL:-60s}
READY_TIMEOUT=${READY_TIMEOUT:-90s}
PORT=${PORT:-18940}
BROKERS="fieldgate mosquitto"
result_files idle

take_bench_lock "waiting for another benchmark run to finish"

state_tmp idle
kill_on_exit "configurations, logs and state"

declare -A skip=()
echo "== building"
build_fieldgate
if [ -n "${skip[fieldgate]:-}" ]; then
	echo "bench-idle: ${skip[fieldgate]}" >&2
	exit 1
fi
find_mosquitto
if [ -z "$mosquitto_bin" ]; then
	echo "bench-idle: the bridges' upstream is a Mosquitto: ${skip[mosquitto]}" >&2
	exit 1
fi
tool="$tmp/footprint"
go build -o "$tool" ./cmd/footprint

# warn MESSAGE: a problem, in the raw output (and so in the summary).
warn() {
	echo "# warn $*" | tee -a "$raw" >&2
	status=1
}

# sensors50: the sensors section of sensors50, on stdout.
sensors50() {
	local i
	echo "sensors:"
	for i in $(seq -w 1 12); do
		echo "  - {name: climate$i, kind: bme280, bus: sim, address: \"0x76\", interval: $SENSOR_INTERVAL}"
		echo "  - {name: cellar$i, kind: sht3x, bus: sim, address: \"0x44\", interval: $SENSOR_INTERVAL}"
		echo "  - {name: tank$i, kind: ads1115, bus: sim, address: \"0x48\", interval: $SENSOR_INTERVAL," \
			"channels: [{name: pressure, input: A0, unit: bar, from: [0.4, 2.0], to: [0, 10], range: [-0.5, 10.5]}]}"
		echo "  - {name: power$i, kind: ina219, bus: sim, address: \"0x40\", interval: $SENSOR_INTERVAL}"
	done
	echo "  - {name: door, kind: gpio_in, bus: sim, address: SIM_IN0, interval: 60s}"
	echo "  - {name: water, kind: gpio_in, bus: sim, address: SIM_IN1, interval: 30s, options: {mode: counter}}"
}

# idle_config LABEL DIR MQTT OPS: writes DIR/fieldgate.yaml for
# configuration LABEL.
idle_config() {
	local label=$1 dir=$2 cfg=$2/fieldgate.yaml route=bench/idle/#
	gateway_config "$dir" "$3" "$4"
	case $label in
	sensors50*)
		# The default's sensors section (up to outputs:) gives way to the 50.
		awk '/^sensors:/ { skip = 1; next } /^outputs:/ { skip = 0 } !skip' "$cfg" >"$cfg.new"
		sensors50 >>"$cfg.new"
		mv "$cfg.new" "$cfg"
		;;
	esac
	case $label in
	*-nobridge) return ;;
	*-forwarding) route='fieldgate/#' ;;
	esac
	cat >>"$cfg" <<-EOF
		bridges:
		  - name: cloud
		    address: 127.0.0.1:$PORT
		    client_id: fieldgate-idle-$label
		    reconnect_min: 1s
		    reconnect_max: 2s
		    out:
		      - filter: $route
		        qos: 1
	EOF
}

settings="DURATION=$DURATION SETTLE=$SETTLE CONFIGS=\"$CONFIGS\" SENSOR_INTERVAL=$SENSOR_INTERVAL"
{
	describe_machine
	echo "fieldgate: $fieldgate_version"
	echo "mosquitto: $mosquitto_version"
	echo "disk: $disk"
	describe_run "$settings"
} | tee "$raw"

if port_busy "$PORT"; then
	warn "the upstream's port $PORT is already in use"
	exit 1
fi
mkdir -p "$tmp/upstream"
mosquitto_config "$tmp/upstream/mosquitto.conf" "$PORT"
"$mosquitto_bin" -c "$tmp/upstream/mosquitto.conf" >"$tmp/upstream/log" 2>&1 &
pids+=($!)

start=$SECONDS
n=0
declare -A gw=() watcher=()
for c in $CONFIGS; do
	n=$((n + 1))
	case $c in
	default | default-forwarding | default-nobridge | sensors50 | sensors50-forwarding | sensors50-nobridge) ;;
	*)
		warn "$c: no such configuration (default, sensors50, each also -forwarding and -nobridge)"
		continue
		;;
	esac
	mqtt=$((PORT + 2 * n - 1)) ops=$((PORT + 2 * n))
	if port_busy "$mqtt" || port_busy "$ops"; then
		warn "$c: port $mqtt or $ops is already in use"
		continue
	fi
	dir="$tmp/$c"
	mkdir -p "$dir"
	idle_config "$c" "$dir" "$mqtt" "$ops"
	if ! out=$("$root/bin/fieldgate" check -config "$dir/fieldgate.yaml" 2>&1); then
		warn "$c: the configuration does not check: $out"
		continue
	fi
	echo "config $c sensors=$(grep -cE '^  - (name: |\{name: )' <(sed -n '/^sensors:/,/^[a-z]/p' "$dir/fieldgate.yaml"))" \
		"route=$(sed -n 's/^      - filter: //p' "$dir/fieldgate.yaml")" >>"$raw"
	# In its own directory, where anything relative lands.
	(cd "$dir" && exec "$root/bin/fieldgate" run -config "$dir/fieldgate.yaml" >"$dir/log" 2>&1) &
	gw[$c]=$!
	pids+=("${gw[$c]}")
	bridged=()
	if [[ $c != *-nobridge ]]; then bridged=(-bridged); fi
	"$tool" idle -label "$c" -pid "${gw[$c]}" -ops "127.0.0.1:$ops" "${bridged[@]}" \
		-settle "$SETTLE" -duration "$DURATION" -ready-timeout "$READY_TIMEOUT" >"$dir/idle" 2>&1 &
	watcher[$c]=$!
	pids+=("${watcher[$c]}")
done
if [ ${#gw[@]} -gt 0 ]; then echo "== ${!gw[*]}: $SETTLE to settle once ready, then $DURATION measured" >&2; fi
for c in $CONFIGS; do
	[ -n "${watcher[$c]:-}" ] || continue
	wait "${watcher[$c]}" && rc=0 || rc=$?
	tee -a "$raw" <"$tmp/$c/idle"
	if [ "$rc" -ne 0 ]; then
		status=1
		log_tail "$tmp/$c/log" | tee -a "$raw" >&2
	fi
done
for c in "${!gw[@]}"; do kill -TERM "${gw[$c]}" 2>/dev/null || true; done
for c in $CONFIGS; do
	[ -n "${gw[$c]:-}" ] || continue
	wait "${gw[$c]}" && rc=0 || rc=$?
	if [ "$rc" -ne 0 ]; then
		warn "$c: the gateway ended with status $rc (SIGTERM should end it with 0); its log ends:"
		log_tail "$tmp/$c/log" | tee -a "$raw" >&2
	fi
done

summarize "$start" idle
exit $status
