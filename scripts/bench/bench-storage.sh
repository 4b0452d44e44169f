#!/usr/bin/env bash
# Side-by-side benchmark of persisted QoS 1 publishing: fieldgate's broker
# with its storage package, mochi-mqtt's full server with its bolt storage
# hook (cmd/mochiserver -bolt) and Mosquitto with persistence on, one at a
# time on this machine, driven by the same load generator (cmd/brokerload,
# the persist scenarios of package brokerbench).
#
# For each publisher count in PUBS, every broker is started fresh, with a
# new state file under STATE_DIR, and three persistent sessions (MQTT 3.1.1,
# clean session 0) subscribe at QoS 1 to the publishers' topics and
# disconnect; then the publishers send as fast as the broker acknowledges,
# so that every message is queued on disk three times. Figures: PUBACKs per
# second; sync calls (fsync, fdatasync) per second and per message, counted
# by strace; bytes written to disk per message, from /proc/PID/io; and
# whether one session's queue reads back whole. Raw output goes to
# results/storage-ARCH.txt (Go benchmark lines, readable by benchstat), the
# Markdown summary with medians, targets and durability caveats to
# results/storage-summary.md, which is printed. QUICK=1 writes
# results/storage-quick-ARCH.txt and storage-quick-summary.md instead.
#
# Every run is repeated on a fresh broker started under strace -f
# --seccomp-bpf, which stops the broker only at the sync calls it traces,
# to count them (scenario persist-qos1-PxS-traced). Those stops slow a
# broker that syncs thousands of times a second by a quarter or more, so
# throughput and bytes come from the run without strace. Without strace,
# or with a kernel or strace that cannot filter with seccomp, fsync
# figures are n/a and the rest is measured.
#
# Environment:
#   QUICK=1           smoke run, under a minute: COUNT=1 DURATION=1s WARMUP=0.25s
#                     DRAIN=3s (each can still be set)
#   COUNT=3           repetitions (the summary shows medians)
#   DURATION=5s       measured interval
#   WARMUP=1s         load before measuring
#   PUBS="1 10 100"   publisher counts, one scenario each
#   SUBS=3            offline persistent sessions every message is queued for
#   WINDOW=8          PUBLISHes each publisher has waiting for PUBACK
#   PAYLOAD=64        message payload in bytes
#   DRAIN=30s         longest read-back of one session's queue after measuring; 0 skips it
#   BROKERS="fieldgate mochi mosquitto"
#   STATE_DIR         where the state files go (default TMPDIR or /tmp); put it on
#                     the disk to be measured, never on tmpfs
#   PORT=18840        brokers listen on 127.0.0.1:PORT+1 (fieldgate), +2 (mochi), +3 (mosquitto)
#   STRACE=0          run the brokers without strace (no fsync figures), to see what tracing costs
#   KEEP_LOGS=1       keep the brokers' logs, configs, strace logs and state files
#
# Mosquitto and strace come from Debian's packages; as root the script
# installs them when missing.
set -euo pipefail

cd "$(dirname "$0")"
. ./lib.sh

if [ "${QUICK:-0}" = 1 ]; then
	COUNT=${COUNT:-1} DURATION=${DURATION:-1s} WARMUP=${WARMUP:-0.25s} DRAIN=${DRAIN:-3s}
fi
COUNT=${COUNT:-3}
DURATION=${DURATION:-5s}
WARMUP=${WARMUP:-1s}
PUBS=${PUBS:-"1 10 100"}
SUBS=${SUBS:-3}
WINDOW=${WINDOW:-8}
PAYLOAD=${PAYLOAD:-64}
DRAIN=${DRAIN:-30s}
BROKERS=${BROKERS:-"fieldgate mochi mosquitto"}
PORT=${PORT:-18840}
result_files storage

# The broker benchmark shares the cores (and a run of this one the disk):
# one at a time.
take_bench_lock "waiting for another broker benchmark to finish"

state_tmp storage
kill_on_exit "broker logs, configs and state"

build_tools
assign_ports "$PORT"
build_fieldgate
find_mosquitto

# strace logs the sync calls; --seccomp-bpf keeps it off every other call.
sync_calls=fsync,fdatasync,sync_file_range,syncfs
strace_bin=$(command -v strace || true)
if [ -z "$strace_bin" ] && [ "${STRACE:-1}" != 0 ] && apt_install strace; then
	strace_bin=$(command -v strace || true)
fi
tracing=0
if [ "${STRACE:-1}" = 0 ]; then
	strace_note="n/a: STRACE=0"
elif [ -z "$strace_bin" ]; then
	strace_note="n/a: strace is not installed (sudo apt-get install -y strace)"
elif ! err=$("$strace_bin" -f --seccomp-bpf -qq -e trace="$sync_calls" -o /dev/null true 2>&1); then
	strace_note="n/a: strace cannot trace here: $(head -1 <<<"$err")"
else
	tracing=1
	strace_note="$("$strace_bin" -V | head -1 | sed 's/ -- version//'), in a second run of every scenario with the broker started under \`strace -f --seccomp-bpf -e trace=$sync_calls\` (stopped only at those calls); calls started in the measured interval"
fi

settings="COUNT=$COUNT DURATION=$DURATION WARMUP=$WARMUP PUBS=\"$PUBS\" SUBS=$SUBS WINDOW=$WINDOW PAYLOAD=$PAYLOAD B DRAIN=$DRAIN"
{
	describe_machine
	echo "fieldgate: $fieldgate_version"
	describe_module mochi github.com/mochi-mqtt/server/v2
	echo "bbolt: $(go list -m -f '{{.Version}}' go.etcd.io/bbolt) (for fieldgate and mochi's hook alike: Go's module selection takes the newer of their requirements)"
	echo "mosquitto: $mosquitto_version"
	echo "disk: $disk"
	echo "strace: $strace_note"
	describe_run "$settings"
} | tee "$raw"

# start_broker NAME DIR TRACED: starts NAME on its port with its state in
# DIR, under strace when TRACED is 1, setting bpid (the broker), tpid (what
# to wait for: strace or the broker) and blog.
start_broker() {
	local name=$1 dir=$2 traced=$3 p=${port[$1]} cmd i c want
	blog="$dir/log"
	case $name in
	fieldgate)
		# Queue budgets far above a run's messages: every message must be
		# stored, none dropped to make room.
		fieldgate_config "$dir" "$p" "max_subscriptions: 2000" "max_queued_bytes: 1073741824"
		echo "  max_queued_bytes: 1073741824" >>"$dir/fieldgate.yaml"
		cmd=("$root/bin/fieldgate" run -config "$dir/fieldgate.yaml")
		;;
	mochi)
		cmd=("$tmp/mochiserver" -addr "127.0.0.1:$p" -bolt "$dir/mochi.db")
		;;
	mosquitto)
		# max_queued_messages 0: no limit (the default, 1000, would drop).
		mosquitto_config "$dir/mosquitto.conf" "$p" "persistence true" "persistence_location $dir/" \
			"max_queued_messages 0" "connection_messages false"
		cmd=("$mosquitto_bin" -c "$dir/mosquitto.conf")
		;;
	*)
		echo "unknown broker $name" >&2
		return 1
		;;
	esac
	if [ "$traced" = 1 ]; then
		"$strace_bin" -f --seccomp-bpf -qq -e signal=none -e trace="$sync_calls" -ttt \
			-o "$dir/sync.log" -- "${cmd[@]}" >"$blog" 2>&1 &
		tpid=$!
		pids+=("$tpid")
		# strace forks short-lived children of its own to probe the
		# kernel before it starts the broker: wait for the one running
		# the broker's binary.
		want=$(readlink -f "${cmd[0]}")
		bpid=
		for i in $(seq 100); do
			for c in $(cat /proc/"$tpid"/task/*/children 2>/dev/null); do
				if [ "$(readlink -f "/proc/$c/exe" 2>/dev/null)" = "$want" ]; then bpid=$c; fi
			done
			[ -n "$bpid" ] && break
			kill -0 "$tpid" 2>/dev/null || break
			sleep 0.05
		done
		if [ -z "$bpid" ]; then
			echo "strace did not start $name" >&2
			bpid=$tpid
		fi
		# Killing strace would leave the broker running, detached.
		pids+=("$bpid")
	else
		"${cmd[@]}" >"$blog" 2>&1 &
		tpid=$!
		bpid=$tpid
		pids+=("$tpid")
	fi
}

# stop_broker PORT: SIGKILL, as a crash would, and wait for PORT to close.
# A clean shutdown would have Mosquitto write its whole state, hundreds of
# MB after a fast run, which the kernel would still be flushing while the
# next broker is measured; the state is thrown away anyway. A traced
# broker is not a child of this shell, so its end shows in its port.
stop_broker() {
	local i
	kill -KILL "$bpid" "$tpid" 2>/dev/null || true
	wait "$tpid" 2>/dev/null || true
	for i in $(seq 100); do
		port_busy "$1" || break
		sleep 0.05
	done
}

passes=(0)
if [ "$tracing" = 1 ]; then passes+=(1); fi
start=$SECONDS
runs=0
for rep in $(seq "$COUNT"); do
	for b in $BROKERS; do
		for n in $PUBS; do
			for traced in "${passes[@]}"; do
				[ -n "${skip[$b]:-}" ] && continue
				scenario="persist-qos1-${n}x$SUBS"
				if [ "$traced" = 1 ]; then scenario+="-traced"; fi
				echo "== run $rep/$COUNT: $b: $scenario" >&2
				if port_taken "$b"; then continue; fi
				runs=$((runs + 1))
				dir="$tmp/$b-$runs"
				mkdir -p "$dir"
				# The traced run counts sync calls and skips the read-back:
				# the run without strace checks the queue.
				args=(-drain "$DRAIN")
				if [ "$traced" = 1 ]; then args=(-drain 0 -sync-log "$dir/sync.log"); fi
				start_broker "$b" "$dir" "$traced"
				set +e
				"$load" run -broker "$b" -addr "127.0.0.1:${port[$b]}" -pid "$bpid" -scenarios persist \
					-persist-pubs "$n" -persist-subs "$SUBS" -persist-window "$WINDOW" "${args[@]}" \
					-warmup "$WARMUP" -duration "$DURATION" -payload "$PAYLOAD" | tee -a "$raw"
				rc=${PIPESTATUS[0]}
				set -e
				if ! kill -0 "$bpid" 2>/dev/null; then
					broker_exited "$b/$scenario" "" "$blog"
				fi
				stop_broker "${port[$b]}"
				check_load "$b" "$rc" "$blog"
				# State files of a fast broker run to hundreds of MB; what of
				# them is still dirty must not be written during the next run.
				if [ "${KEEP_LOGS:-0}" != 1 ]; then rm -rf "$dir"; fi
				sync -f "$tmp"
			done
		done
	done
done
summarize "$start" storage
exit $status
