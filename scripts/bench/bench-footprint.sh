#!/usr/bin/env bash
# What fieldgate costs a small board, in three steps:
#
#   sizes  builds the release binaries exactly as `make cross` and `make deb`
#          do (the commands are taken from `make -n deb`), plus a 386 one
#          built alike, into a temporary directory, and reports their sizes,
#          and those of any .deb packages `make deb` left in bin/;
#   heap   runs BenchmarkFootprint (gateway/broker/footprint_bench_test.go),
#          built for each of HEAP_ARCHES, each run in a fresh process: live
#          heap and goroutine stacks per idle connection (CONNS of them) and
#          per subscription (SUBS over SUBCONNS connections), measured after
#          full collections. 386 and amd64 run natively, COUNT times; 386 is
#          the 32-bit stand-in for the ARM boards. armv6 and arm64 run under
#          qemu-user-static, EMULATED_COUNT times, to check the stand-ins:
#          the heap is the guest's own, whatever runs its instructions;
#   rss    runs the release binaries of RSS_TARGETS at the same time, each
#          on the embedded default configuration with its own ports and
#          state file, the ARM ones under qemu-user-static (armv6 with
#          -cpu arm1176), for DURATION after each is ready, sampling the
#          process's VmRSS and the gateway's /metrics every second and
#          counting the readings a subscriber receives (cmd/footprint watch).
#
# Raw output goes to results/footprint-ARCH.txt and the Markdown section
# "## ARM footprint" to results/footprint-summary.md, which is printed;
# QUICK=1 writes results/footprint-quick-* instead.
#
# Environment:
#   QUICK=1              smoke run: COUNT=1 DURATION=10s CONNS=2000 SUBS=20000
#                        (each can still be set)
#   STEPS="sizes heap rss"
#   HEAP_ARCHES="386 armv6 amd64 arm64"   (armv7 can be added)
#   COUNT=3              heap: runs of a native binary (the summary shows medians)
#   EMULATED_COUNT=1     heap: runs of an emulated one, which take longer
#   CONNS=10000          heap: idle connections
#   SUBS=100000          heap: subscriptions, over SUBCONNS=100 connections
#   DURATION=60s         rss: how long each gateway is sampled once ready
#   RSS_TARGETS="armv6 arm64 386 amd64"   (armv7 can be added)
#   READY_TIMEOUT=90s    rss: how long a gateway may take to answer /readyz
#   PORT=18860           rss: the n-th target listens on MQTT PORT+2n+1, ops PORT+2n+2
#   KEEP_LOGS=1          keep the binaries, configs, logs and state (the path is printed)
set -euo pipefail

cd "$(dirname "$0")"
. ./lib.sh

if [ "${QUICK:-0}" = 1 ]; then
	COUNT=${COUNT:-1} DURATION=${DURATION:-10s}
	CONNS=${CONNS:-2000} SUBS=${SUBS:-20000}
fi
STEPS=${STEPS:-"sizes heap rss"}
COUNT=${COUNT:-3}
CONNS=${CONNS:-10000}
SUBS=${SUBS:-100000}
SUBCONNS=${SUBCONNS:-100}
HEAP_ARCHES=${HEAP_ARCHES:-"386 armv6 amd64 arm64"}
EMULATED_COUNT=${EMULATED_COUNT:-1}
DURATION=${DURATION:-60s}
RSS_TARGETS=${RSS_TARGETS:-"armv6 arm64 386 amd64"}
READY_TIMEOUT=${READY_TIMEOUT:-90s}
PORT=${PORT:-18860}
BROKERS="" # describe_run lists skipped brokers; there are none here
result_files footprint

take_bench_lock "waiting for another benchmark run to finish"

tmp=$(mktemp -d)
kill_on_exit "binaries, configs, logs and state"
mkdir -p "$tmp/bin"

step() { [[ " $STEPS " == *" $1 "* ]]; }

# warn MESSAGE: a problem, in the raw output (and so in the summary).
warn() {
	echo "# warn $*" | tee -a "$raw" >&2
	status=1
}

# The release build commands, as make would run them, writing into bin/.
# The 386 binary is the amd64 command for GOARCH=386.
release_commands() {
	local cmds amd64
	cmds=$(make -C "$root" -n --no-print-directory deb |
		grep -E '^GOOS=linux .*go build .* -o bin/fieldgate-linux-[a-z0-9]+ \./cmd/fieldgate$') || {
		echo "make -n deb printed no release build commands; has the Makefile changed?" >&2
		return 1
	}
	amd64=$(grep -e '-o bin/fieldgate-linux-amd64 ' <<<"$cmds") || {
		echo "make -n deb builds no amd64 binary to derive the 386 one from" >&2
		return 1
	}
	printf '%s\n%s\n' "$cmds" "${amd64//amd64/386}"
}

# build_binaries: every release binary into tmp/bin; the commands go to
# tmp/release and the ones that failed to tmp/failed, for the raw output.
build_binaries() {
	local line
	echo "== building the release binaries" >&2
	: >"$tmp/release"
	: >"$tmp/failed"
	while IFS= read -r line; do
		echo "+ $line" >&2
		echo "release: $line" >>"$tmp/release"
		if ! (cd "$root" && eval "${line/-o bin\//-o $tmp/bin/}"); then
			echo "$line" >>"$tmp/failed"
		fi
	done < <(release_commands)
}

# field NAME LINE: the value of NAME=... in a build command.
field() { grep -oE "(^| )$1=[^ ]+" <<<"$2" | head -1 | cut -d= -f2 || true; }

# size_lines: a size line per binary built, a deb line per package in bin/.
size_lines() {
	local line file goarm deb
	while IFS= read -r line; do
		line=${line#release: }
		file=${line##*-o bin/}
		file=${file%% *}
		[ -f "$tmp/bin/$file" ] || continue
		goarm=$(field GOARM "$line")
		echo "size ${file#fieldgate-linux-} bytes=$(stat -c %s "$tmp/bin/$file") file=$file" \
			"goos=$(field GOOS "$line") goarch=$(field GOARCH "$line")${goarm:+ goarm=$goarm}"
	done <"$tmp/release"
	for deb in "$root"/bin/fieldgate_*.deb; do
		[ -e "$deb" ] || continue
		echo "deb $(basename "$deb") bytes=$(stat -c %s "$deb")"
	done
}

# target LABEL: sets goarch and goarm (empty but for 32-bit ARM) for the
# binary LABEL names, and how: the emulator that runs it here, with its
# options, or "native".
target() {
	goarm=
	case $1 in
	armv6) goarch=arm goarm=6 how="qemu-arm-static -cpu arm1176" ;;
	armv7) goarch=arm goarm=7 how="qemu-arm-static" ;;
	arm64) goarch=arm64 how="qemu-aarch64-static" ;;
	386 | amd64) goarch=$1 how=native ;;
	*)
		warn "$1: no such binary (armv6, armv7, arm64, 386 or amd64)"
		return 1
		;;
	esac
	if [ "$how" != native ] && ! command -v "${how%% *}" >/dev/null; then
		warn "$1: ${how%% *} is not installed (apt-get install qemu-user-static)"
		return 1
	fi
}

# heap_runs: BenchmarkFootprint for every binary of HEAP_ARCHES, native
# ones COUNT times and emulated ones EMULATED_COUNT times, each run in a
# fresh process.
heap_runs() {
	local a bin i rc runs run
	for a in $HEAP_ARCHES; do
		target "$a" || continue
		bin="$tmp/broker-$a.test"
		echo "== heap: building BenchmarkFootprint for $a" >&2
		if ! (cd "$root" && GOARCH=$goarch GOARM=$goarm CGO_ENABLED=0 go test -c -o "$bin" ./gateway/broker); then
			warn "heap $a: the test binary did not build"
			continue
		fi
		run=()
		runs=$COUNT
		if [ "$how" != native ]; then
			read -ra run <<<"$how"
			runs=$EMULATED_COUNT
		fi
		if ! "${run[@]}" "$bin" -test.run '^$' >/dev/null 2>&1; then
			warn "heap $a: this machine cannot run $a binaries${run[*]:+ with ${run[*]}}"
			continue
		fi
		echo "runner $a $how" >>"$raw"
		for i in $(seq "$runs"); do
			echo "== heap: $a run $i/$runs" >&2
			echo "heap-binary: $a" >>"$raw"
			set +e
			# In the package's directory, as go test would run it; an
			# emulated benchmark starts its client process emulated too.
			(cd "$root/gateway/broker" && FIELDGATE_FOOTPRINT_RUNNER="${run[*]}" "${run[@]}" "$bin" \
				-test.run '^$' -test.bench '^BenchmarkFootprint$' -test.benchtime 1x \
				-footprint.conns "$CONNS" -footprint.subs "$SUBS" -footprint.subconns "$SUBCONNS") | tee -a "$raw"
			rc=${PIPESTATUS[0]}
			set -e
			if [ "$rc" -ne 0 ]; then warn "heap $a run $i: the benchmark failed (status $rc)"; fi
		done
	done
}

# rss_runs: every binary of RSS_TARGETS at once, each watched by
# cmd/footprint watch; their lines go to the raw output in order.
rss_runs() {
	local watch="$tmp/footprint" n=0 t dir mqtt ops bin rc check='' run
	local -A gw=() watcher=()
	go build -o "$watch" ./cmd/footprint
	if [ -x "$tmp/bin/fieldgate-linux-$arch" ]; then check="$tmp/bin/fieldgate-linux-$arch"; fi
	for t in $RSS_TARGETS; do
		n=$((n + 1))
		target "$t" || continue
		bin="$tmp/bin/fieldgate-linux-$t"
		if [ ! -x "$bin" ]; then
			warn "rss $t: there is no ${bin##*/}: its release build failed"
			continue
		fi
		mqtt=$((PORT + 2 * n - 1)) ops=$((PORT + 2 * n))
		if port_busy "$mqtt" || port_busy "$ops"; then
			warn "rss $t: port $mqtt or $ops is already in use"
			continue
		fi
		dir="$tmp/rss-$t"
		mkdir -p "$dir"
		gateway_config "$dir" "$mqtt" "$ops"
		if [ -n "$check" ]; then "$check" check -config "$dir/fieldgate.yaml" >/dev/null; fi
		echo "runner $t $how" >>"$raw"
		run=()
		if [ "$how" != native ]; then read -ra run <<<"$how"; fi
		# In its own directory, where anything relative lands.
		(cd "$dir" && exec "${run[@]}" "$bin" run -config "$dir/fieldgate.yaml" >"$dir/log" 2>&1) &
		gw[$t]=$!
		pids+=("${gw[$t]}")
		"$watch" watch -label "$t" -pid "${gw[$t]}" -mqtt "127.0.0.1:$mqtt" -ops "127.0.0.1:$ops" \
			-duration "$DURATION" -ready-timeout "$READY_TIMEOUT" >"$dir/watch" 2>&1 &
		watcher[$t]=$!
		pids+=("${watcher[$t]}")
	done
	if [ ${#gw[@]} -gt 0 ]; then echo "== rss: ${!gw[*]} for $DURATION once ready" >&2; fi
	for t in $RSS_TARGETS; do
		[ -n "${watcher[$t]:-}" ] || continue
		wait "${watcher[$t]}" && rc=0 || rc=$?
		cat "$tmp/rss-$t/watch" >>"$raw"
		if [ "$rc" -ne 0 ]; then status=1; fi
	done
	for t in $RSS_TARGETS; do
		[ -n "${gw[$t]:-}" ] || continue
		kill -TERM "${gw[$t]}" 2>/dev/null || true
	done
	for t in $RSS_TARGETS; do
		[ -n "${gw[$t]:-}" ] || continue
		wait "${gw[$t]}" && rc=0 || rc=$?
		if [ "$rc" -ne 0 ]; then
			warn "rss $t: the gateway ended with status $rc (SIGTERM should end it with 0); its log ends:"
			log_tail "$tmp/rss-$t/log" | tee -a "$raw" >&2
		fi
	done
	grep -h '^rss ' "$tmp"/rss-*/watch >&2 || true
}

start=$SECONDS
if step sizes || step rss; then build_binaries; fi
settings="STEPS=\"$STEPS\" HEAP_ARCHES=\"$HEAP_ARCHES\" COUNT=$COUNT EMULATED_COUNT=$EMULATED_COUNT CONNS=$CONNS SUBS=$SUBS over $SUBCONNS connections, RSS_TARGETS=\"$RSS_TARGETS\" DURATION=$DURATION"
{
	describe_machine
	if [ -x "$tmp/bin/fieldgate-linux-$arch" ]; then
		echo "fieldgate: $("$tmp/bin/fieldgate-linux-$arch" version | paste -sd' ' -)"
	fi
	if command -v qemu-arm-static >/dev/null; then echo "qemu: $(qemu-arm-static --version | head -1)"; fi
	describe_run "$settings"
} | tee "$raw"
if [ -s "$tmp/release" ]; then cat "$tmp/release" >>"$raw"; fi
if [ -s "$tmp/failed" ]; then
	while IFS= read -r line; do warn "build failed: $line"; done <"$tmp/failed"
fi
if step sizes; then size_lines | tee -a "$raw"; fi
if step heap; then heap_runs; fi
if step rss; then rss_runs; fi

summarize "$start" footprint
exit $status
