#!/usr/bin/env bash
# Side-by-side benchmark of bridging through an outage: fieldgate's bridge
# (its durable outbox in bbolt) against Mosquitto's own bridge, one at a
# time on this machine, both carrying the same local topics to the same
# upstream broker and driven by the same load generator (cmd/bridgeload,
# the bridge scenarios of package brokerbench).
#
# The upstream is a Mosquitto with persistence on, on a loopback port of its
# own. On it, one persistent session (clean session 0, QoS 1) subscribed to
# the bridged topics (bench/#) counts what arrives: it is connected
# throughout, except while the upstream is down, and comes back into its
# session within 20 ms of the upstream listening again, so the upstream
# keeps for it whatever arrives before it is back. Every run:
#
#  1. starts a fresh upstream and the counting session, then the broker
#     under test (new state) with a bridge to the upstream, and waits until
#     a probe message published to it arrives upstream: the bridge is up;
#  2. stops the upstream (SIGTERM: an outage) and publishes N numbered QoS
#     1 messages to the broker under test, PUBS publishers each with WINDOW
#     awaiting PUBACK, as fast as it acknowledges them ("outage": PUBACKs
#     per second; bytes the broker wrote to disk per message, from
#     write_bytes in /proc/PID/io over the same interval);
#  3. drain runs: one publisher sends to the broker under test for 1 s
#     ("live-outage": its PUBACKs per second with the upstream down), then
#     the upstream starts again and the counter counts until all N have
#     arrived ("drain": messages per second from the first message
#     upstream to the N-th, the wait from the upstream's return to the
#     first, and the CPU time of the upstream and of the broker under test
#     over the drain, from /proc/PID/stat), while that publisher sends
#     again as fast as the broker acknowledges, from the first message
#     upstream to the N-th (its PUBACKs per second);
#     crash runs: SIGKILL the broker under test right after the last PUBACK
#     ("crash"), or CRASH_LATE seconds after it ("crash-afterNs": time for
#     Mosquitto to autosave), start it again on the same state, start the
#     upstream and count how many of the N acknowledged messages arrive;
#  4. stops both brokers and removes their state.
#
# Each repetition runs a drain, a crash and a crash-late run for every
# broker, and a reference run ("direct") in which the load generator
# publishes the N messages straight to a fresh upstream; one more drain run
# has fieldgate's bridge paced at PACED_RATE messages a second (its
# default) to show the pacing. Raw output goes to results/bridge-ARCH.txt
# (Go benchmark lines, readable by benchstat), the Markdown summary with
# medians, the ratios fieldgate ÷ Mosquitto and the target (a drain at
# least twice as fast as Mosquitto's bridge: met or not, and whether this
# upstream could take it at all) to results/bridge-summary.md, which is
# printed. QUICK=1 writes results/bridge-quick-ARCH.txt and
# bridge-quick-summary.md instead.
#
# Configuration of the brokers under test (the summary repeats it):
#   fieldgate: bridge with an out-route bench/# at QoS 1, rate 0 (unpaced;
#     PACED_RATE for the paced run), max_inflight INFLIGHT (32, its default),
#     reconnect_min 1s and reconnect_max 2s, max_outbox_bytes 1 GiB (so that
#     nothing is dropped), protocol auto (MQTT 5 to this upstream).
#   mosquitto: persistence true, autosave_interval AUTOSAVE (1 s: the
#     shortest time-based interval, which 2.0.11 turns into a save every
#     2 s; its default, 1800 s, would leave the bridge queue in memory only
#     for half an hour), max_queued_messages 0 (no limit: its default of
#     1000 would drop the backlog), max_inflight_messages INFLIGHT (32, as
#     fieldgate's; the default is 20), and a connection section: topic
#     bench/# out 1, cleansession false, restart_timeout 1 2 (backing off
#     from 1 s to 2 s, like fieldgate's here; the default backs off from 5 s
#     to 30 s, and a constant "restart_timeout 1" reconnects only after 3
#     to 6 s in 2.0.11), notifications false, MQTT 3.1.1 (its default
#     bridge protocol).
#   upstream: Mosquitto with persistence true (saved when it is stopped),
#     max_queued_messages 0 and max_inflight_messages 0, so that neither
#     its queue for the counting session nor its window towards it limits
#     the drain.
#
# Environment:
#   QUICK=1           smoke run, under two minutes: COUNT=1 N=10000 IDLE=6s (each can
#                     still be set)
#   COUNT=3           repetitions (the summary shows medians)
#   N=100000          messages published during each outage
#   PUBS=10           publishers sending them
#   WINDOW=8          QoS 1 messages each publisher, and the live one, has awaiting PUBACK
#   PAYLOAD=64        message payload in bytes (8 or more: the message number)
#   PACED_RATE=500    fieldgate's bridge rate in the paced run; 0 skips that run
#   AUTOSAVE=1        Mosquitto's autosave_interval in seconds
#   INFLIGHT=32       both bridges' window: fieldgate's max_inflight and Mosquitto's
#                     max_inflight_messages
#   LIVE=1            0: no live publisher during the drain
#   IDLE=10s          a count ends when nothing new arrived upstream for this long
#                     after the upstream came back (reconnecting takes a bridge 1-2 s)
#   CRASH_LATE=3      seconds between the last PUBACK and SIGKILL in the crash-late
#                     runs (more than Mosquitto's autosave period); 0 skips them
#   BROKERS="fieldgate mosquitto"
#   STATE_DIR         where the state files go (default TMPDIR or /tmp); put it on
#                     the disk to be measured, never on tmpfs
#   PORT=18850        the first loopback port tried; the upstream and each broker under
#                     test take the next free ones from there
#   KEEP_LOGS=1       keep the brokers' logs, configs and state files
#
# Mosquitto comes from Debian's package; as root the script installs it
# when missing.
set -euo pipefail

cd "$(dirname "$0")"
. ./lib.sh

if [ "${QUICK:-0}" = 1 ]; then
	COUNT=${COUNT:-1} N=${N:-10000} IDLE=${IDLE:-6s}
fi
COUNT=${COUNT:-3}
N=${N:-100000}
PUBS=${PUBS:-10}
WINDOW=${WINDOW:-8}
PAYLOAD=${PAYLOAD:-64}
PACED_RATE=${PACED_RATE:-500}
AUTOSAVE=${AUTOSAVE:-1}
INFLIGHT=${INFLIGHT:-32}
LIVE=${LIVE:-1}
IDLE=${IDLE:-10s}
CRASH_LATE=${CRASH_LATE:-3}
BROKERS=${BROKERS:-"fieldgate mosquitto"}
PORT=${PORT:-18850}
result_files bridge

# The other broker benchmarks share the cores and the disk: one at a time.
take_bench_lock "waiting for another broker benchmark to finish"

state_tmp bridge
kill_on_exit "broker logs, configs and state"

echo "== building"
load="$tmp/bridgeload"
go build -o "$load" ./cmd/bridgeload

declare -A skip=()
declare -A port=()
build_fieldgate
# The upstream is a Mosquitto whichever broker is under test.
BROKERS=mosquitto find_mosquitto
if [ -z "$mosquitto_bin" ]; then
	echo "bench-bridge: the upstream is a Mosquitto: ${skip[mosquitto]}" >&2
	exit 1
fi

# free_port FROM: the first port from FROM on that nothing listens on and
# no broker of this run was given.
free_port() {
	local p=$1
	while port_busy "$p" || [[ " ${port[*]} " == *" $p "* ]]; do p=$((p + 1)); done
	echo "$p"
}
port[upstream]=$(free_port "$PORT")
for b in $BROKERS; do port[$b]=$(free_port "$((PORT + 1))"); done

settings="COUNT=$COUNT N=$N PUBS=$PUBS WINDOW=$WINDOW PAYLOAD=$PAYLOAD B PACED_RATE=$PACED_RATE AUTOSAVE=${AUTOSAVE}s INFLIGHT=$INFLIGHT LIVE=$LIVE IDLE=$IDLE CRASH_LATE=${CRASH_LATE}s"
{
	describe_machine
	echo "fieldgate: $fieldgate_version"
	echo "mosquitto: $mosquitto_version"
	echo "mosquitto-autosave: $AUTOSAVE"
	echo "inflight: $INFLIGHT"
	echo "paced-rate: $PACED_RATE"
	echo "n: $N"
	echo "disk: $disk"
	describe_run "$settings"
} | tee "$raw"

# The processes of the run in progress: upstream, broker under test, counter.
upid=
bpid=
cpid=

# wait_port PORT SECONDS: waits until something listens on PORT.
wait_port() {
	local _
	for _ in $(seq $(($2 * 20))); do
		port_busy "$1" && return 0
		sleep 0.05
	done
	return 1
}

# start_upstream DIR: starts the upstream Mosquitto with its state in DIR
# (writing its configuration the first time) and waits until it listens.
start_upstream() {
	local dir=$1
	if [ ! -f "$dir/mosquitto.conf" ]; then
		mosquitto_config "$dir/mosquitto.conf" "${port[upstream]}" "persistence true" "persistence_location $dir/" \
			"max_queued_messages 0" "max_inflight_messages 0" "log_type notice" "connection_messages true"
	fi
	"$mosquitto_bin" -c "$dir/mosquitto.conf" >>"$dir/log" 2>&1 &
	upid=$!
	pids+=("$upid")
	echo "$upid" >"$dir/pid"
	wait_port "${port[upstream]}" 10
}

# stop_upstream: the outage. SIGTERM, so that it saves the counting session.
stop_upstream() {
	kill -TERM "$upid" 2>/dev/null || true
	wait "$upid" 2>/dev/null || true
	upid=
}

# start_broker NAME DIR RATE: starts the broker under test with its state
# in DIR (writing its configuration the first time; fieldgate's bridge at
# RATE) and waits until it listens.
start_broker() {
	local name=$1 dir=$2 rate=$3 p=${port[$1]} cmd
	blog="$dir/log"
	case $name in
	fieldgate)
		if [ ! -f "$dir/fieldgate.yaml" ]; then
			fieldgate_config "$dir" "$p"
			cat >>"$dir/fieldgate.yaml" <<-EOF
				gateway:
				  name: bench
				  discovery: false
				bridges:
				  - name: cloud
				    address: 127.0.0.1:${port[upstream]}
				    client_id: fieldgate-bench-bridge
				    reconnect_min: 1s
				    reconnect_max: 2s
				    rate: $rate
				    max_inflight: $INFLIGHT
				    max_outbox_bytes: 1073741824
				    out:
				      - filter: bench/#
				        qos: 1
			EOF
		fi
		cmd=("$root/bin/fieldgate" run -config "$dir/fieldgate.yaml")
		;;
	mosquitto)
		if [ ! -f "$dir/mosquitto.conf" ]; then
			mosquitto_config "$dir/mosquitto.conf" "$p" "persistence true" "persistence_location $dir/" \
				"autosave_interval $AUTOSAVE" "max_queued_messages 0" "max_inflight_messages $INFLIGHT" \
				"log_type notice" "connection_messages false" "" \
				"connection cloud" "address 127.0.0.1:${port[upstream]}" "clientid mosquitto-bench-bridge" \
				"cleansession false" "restart_timeout 1 2" "notifications false" "topic bench/# out 1"
		fi
		cmd=("$mosquitto_bin" -c "$dir/mosquitto.conf")
		;;
	*)
		echo "unknown broker $name" >&2
		return 1
		;;
	esac
	"${cmd[@]}" >>"$blog" 2>&1 &
	bpid=$!
	pids+=("$bpid")
	echo "$bpid" >"$dir/pid"
	wait_port "$p" 30
}

# stop_run: kills what is left of the run's processes; the state is thrown
# away, so nothing needs a clean shutdown.
stop_run() {
	local pid
	for pid in $cpid $bpid $upid; do
		kill -KILL "$pid" 2>/dev/null || true
		wait "$pid" 2>/dev/null || true
	done
	cpid='' bpid='' upid=''
	# All dead and reaped: cleanup must not signal their ids, which the
	# system may give to other processes.
	pids=()
}

# wait_event NAME SECONDS: waits until the counter has logged event NAME,
# failing early if the counter exits.
wait_event() {
	local _
	for _ in $(seq $(($2 * 20))); do
		grep -q "^$1 " "$events" 2>/dev/null && return 0
		kill -0 "$cpid" 2>/dev/null || return 1
		sleep 0.05
	done
	return 1
}

# run_warn RUN WHAT [LOG]: notes in the raw output that RUN (broker/scenario)
# failed because WHAT, with the end of LOG.
run_warn() {
	echo "# warn $1: $2" | tee -a "$raw"
	if [ -n "${3:-}" ]; then log_tail "$3" | tee -a "$raw"; fi
	status=1
}

# end_count OUT: waits for the counter, which printed OUT, adds OUT to the
# raw output, and sets status to 1 if the counter failed.
end_count() {
	local rc
	set +e
	wait "$cpid"
	rc=$?
	set -e
	cpid=''
	tee -a "$raw" <"$1"
	if [ "$rc" != 0 ]; then status=1; fi
}

# run_direct: the reference run. A fresh upstream and the counting
# session, and one publisher of the load generator sending N numbered
# messages straight to the upstream with the bridges' window: what the
# upstream passes on from one plain client connection, with its CPU time.
run_direct() {
	local dir="$tmp/direct-$runs"
	mkdir -p "$dir/upstream"
	events="$dir/events"
	: >"$events"
	if ! start_upstream "$dir/upstream"; then
		run_warn "upstream/direct" "the upstream did not start" "$dir/upstream/log"
		return 1
	fi
	"$load" count -broker upstream -scenario direct -no-outage -addr "127.0.0.1:${port[upstream]}" -client bench-counter \
		-n "$N" -events "$events" -idle "$IDLE" -limit 300s -upstream-pidfile "$dir/upstream/pid" >"$dir/count.out" &
	cpid=$!
	pids+=("$cpid")
	if ! wait_event subscribed 15; then
		run_warn "upstream/direct" "the counting session could not subscribe" "$dir/upstream/log"
		return 1
	fi
	if ! "$load" publish -broker upstream -scenario direct-publish -addr "127.0.0.1:${port[upstream]}" \
		-n "$N" -pubs 1 -window "$INFLIGHT" -payload "$PAYLOAD" >"$dir/publish.out"; then
		cat "$dir/publish.out" >>"$raw"
		run_warn "upstream/direct" "publishing to the upstream failed" "$dir/upstream/log"
		return 1
	fi
	end_count "$dir/count.out"
}

# run_one BROKER KIND RATE: one run of BROKER; KIND is drain, crash (SIGKILL
# right after the last PUBACK) or crash-late (SIGKILL CRASH_LATE seconds
# after it); RATE is fieldgate's bridge rate (0: unpaced).
run_one() {
	local b=$1 kind=$2 rate=$3 scenario pub_scenario limit rc
	local dir="$tmp/$b-$kind-$runs"
	local count_args=() live=0
	scenario=$kind
	pub_scenario=outage
	case $kind in
	drain)
		if [ "$rate" != 0 ]; then
			scenario=drain-rate$rate
			pub_scenario=outage-rate$rate
		elif [ "$LIVE" != 0 ]; then
			# The live publisher runs in the unpaced drain runs only: in a
			# paced one it would pile up minutes of messages.
			live=1
			count_args=(-live "127.0.0.1:${port[$b]}" -window "$WINDOW" -payload "$PAYLOAD")
		fi
		;;
	crash) pub_scenario=crash-outage ;;
	crash-late)
		scenario=crash-after${CRASH_LATE}s
		pub_scenario=crash-after${CRASH_LATE}s-outage
		;;
	esac
	limit=300
	if [ "$rate" != 0 ]; then limit=$((N * 2 / rate + 60)); fi
	mkdir -p "$dir/upstream" "$dir/broker"
	events="$dir/events"
	: >"$events"

	if ! start_upstream "$dir/upstream"; then
		run_warn "$b/$scenario" "the upstream did not start" "$dir/upstream/log"
		return 1
	fi
	"$load" count -broker "$b" -scenario "$scenario" -addr "127.0.0.1:${port[upstream]}" -client bench-counter \
		-n "$N" -events "$events" -idle "$IDLE" -limit "${limit}s" \
		-upstream-pidfile "$dir/upstream/pid" -broker-pidfile "$dir/broker/pid" "${count_args[@]}" >"$dir/count.out" &
	cpid=$!
	pids+=("$cpid")
	if ! wait_event subscribed 15; then
		cat "$dir/count.out" >>"$raw"
		run_warn "$b/$scenario" "the counting session could not subscribe upstream" "$dir/upstream/log"
		return 1
	fi
	if ! start_broker "$b" "$dir/broker" "$rate"; then
		run_warn "$b/$scenario" "$b did not start listening" "$blog"
		return 1
	fi
	if ! "$load" probe -addr "127.0.0.1:${port[$b]}" || ! wait_event probe 30; then
		run_warn "$b/$scenario" "the probe message did not reach the upstream within 30s: the bridge is not up" "$blog"
		return 1
	fi

	echo "   outage: publishing $N messages" >&2
	stop_upstream
	if ! wait_event down 10; then
		run_warn "$b/$scenario" "the counting session did not notice the upstream stop"
		return 1
	fi
	set +e
	"$load" publish -broker "$b" -scenario "$pub_scenario" -addr "127.0.0.1:${port[$b]}" -pid "$bpid" \
		-n "$N" -pubs "$PUBS" -window "$WINDOW" -payload "$PAYLOAD" | tee -a "$raw"
	rc=${PIPESTATUS[0]}
	set -e
	if [ "$rc" != 0 ]; then
		run_warn "$b/$pub_scenario" "publishing failed (exit status $rc)" "$blog"
		return 1
	fi
	case $kind in
	crash | crash-late)
		if [ "$kind" = crash-late ]; then sleep "$CRASH_LATE"; fi
		echo "   crash: SIGKILL, restart" >&2
		kill -KILL "$bpid" 2>/dev/null || true
		wait "$bpid" 2>/dev/null || true
		echo "--- SIGKILL, restarted on the same state" >>"$blog"
		if ! start_broker "$b" "$dir/broker" "$rate"; then
			run_warn "$b/$scenario" "$b did not start again after SIGKILL" "$blog"
			return 1
		fi
		;;
	esac
	if [ "$live" = 1 ]; then
		# The live publisher's rate with the upstream still down, to
		# compare with its rate while the drain runs. Its messages queue
		# behind the N.
		set +e
		"$load" publish -broker "$b" -scenario live-outage -addr "127.0.0.1:${port[$b]}" -for 1s \
			-pubs 1 -window "$WINDOW" -payload "$PAYLOAD" | tee -a "$raw"
		rc=${PIPESTATUS[0]}
		set -e
		if [ "$rc" != 0 ]; then status=1; fi
	fi

	echo "   upstream back: counting" >&2
	if ! start_upstream "$dir/upstream"; then
		run_warn "$b/$scenario" "the upstream did not start again" "$dir/upstream/log"
		return 1
	fi
	end_count "$dir/count.out"
	if ! kill -0 "$bpid" 2>/dev/null; then
		broker_exited "$b/$scenario" "" "$blog"
		status=1
	fi
	return 0
}

start=$SECONDS
runs=0
plan=()
for rep in $(seq "$COUNT"); do
	plan+=("$rep upstream direct 0")
	for b in $BROKERS; do
		plan+=("$rep $b drain 0" "$rep $b crash 0")
		if [ "$CRASH_LATE" != 0 ]; then plan+=("$rep $b crash-late 0"); fi
	done
done
if [ "$PACED_RATE" != 0 ] && wants fieldgate; then
	plan+=("1 fieldgate drain $PACED_RATE")
fi
for item in "${plan[@]}"; do
	read -r rep b kind rate <<<"$item"
	[ -n "${skip[$b]:-}" ] && continue
	runs=$((runs + 1))
	label="$kind"
	if [ "$rate" != 0 ]; then label+=" at $rate msgs/s"; fi
	echo "== run $runs/${#plan[@]} (repetition $rep/$COUNT): $b: $label" >&2
	if [ "$b" = upstream ]; then
		run_direct || true
	else
		run_one "$b" "$kind" "$rate" || true
	fi
	stop_run
	if [ "${KEEP_LOGS:-0}" != 1 ]; then rm -rf "${tmp:?}/$b-$kind-$runs" "${tmp:?}/direct-$runs"; fi
	sync -f "$tmp"
done
summarize "$start" bridge
exit "$status"
