# shellcheck shell=bash
# Shell functions shared by the bench-*.sh scripts, which source this
# file after changing to scripts/bench. The broker scripts start fieldgate's
# broker, mochi-mqtt's server (cmd/mochiserver) and Mosquitto one at a time
# on loopback ports of their own and drive them with cmd/brokerload.
#
# Sourcing sets here (scripts/bench), root (the repository), results and
# arch. The functions below use these globals, which the scripts set:
#   tmp      scratch directory for binaries, logs, configs and state
#   pids     processes to kill on exit
#   raw      raw output file; summary: Markdown summary file
#   BROKERS  brokers to run
# and set skip (broker -> why it cannot run), port (broker -> port), load
# (the load generator), fieldgate_version, mosquitto_bin, mosquitto_version
# and status.

here=$(pwd)
root=$(cd ../.. && pwd)
results="$here/results"
mkdir -p "$results"
arch=$(go env GOHOSTARCH)
status=0

# result_files NAME: sets raw and summary to results/NAME-ARCH.txt and
# results/NAME-summary.md, or NAME-quick-... for QUICK=1, so that a smoke
# run does not replace a full run's results.
result_files() {
	local name=$1
	if [ "${QUICK:-0}" = 1 ]; then name+=-quick; fi
	raw="$results/$name-$arch.txt"
	summary="$results/$name-summary.md"
}

# take_bench_lock WAITING: one broker benchmark at a time, since runs would
# share the ports, the cores, the disk and the result files. Prints WAITING
# when another run holds the lock.
take_bench_lock() {
	local lock="${TMPDIR:-/tmp}/fieldgate-bench-broker.lock"
	exec 9>"$lock"
	if ! flock -n 9; then
		echo "$1 ($lock)" >&2
		flock 9
	fi
}

# kill_on_exit KEPT: on exit kills what is left of pids and removes tmp,
# unless KEEP_LOGS=1, when it says that KEPT are kept in tmp.
kill_on_exit() {
	kept=$1
	pids=()
	trap cleanup EXIT
	trap 'exit 130' INT TERM
}

cleanup() {
	local pid
	for pid in "${pids[@]}"; do
		if kill -0 "$pid" 2>/dev/null; then
			kill -KILL "$pid" 2>/dev/null || true
			wait "$pid" 2>/dev/null || true
		fi
	done
	if [ "${KEEP_LOGS:-0}" = 1 ]; then
		echo "$kept kept in $tmp" >&2
	else
		rm -rf "$tmp"
	fi
}

# state_tmp NAME: makes tmp, the scratch directory, under STATE_DIR
# (default TMPDIR or /tmp), where the brokers' state files go, and sets
# disk to what the raw output's header says of it. A file system in memory
# gets a warning: fsync costs nothing there, and the figures would say
# nothing about an SD card.
state_tmp() {
	local device fstype
	STATE_DIR=${STATE_DIR:-${TMPDIR:-/tmp}}
	mkdir -p "$STATE_DIR"
	tmp=$(mktemp -d -p "$STATE_DIR" "fieldgate-bench-$1.XXXXXX")
	read -r device fstype < <(df -PT "$tmp" | awk 'NR == 2 { print $1, $2 }')
	disk="$STATE_DIR ($fstype on $device), the same for every broker"
	if [ "$fstype" = tmpfs ] || [ "$fstype" = ramfs ]; then
		echo "warning: STATE_DIR $STATE_DIR is on $fstype, where fsync costs nothing; set STATE_DIR to a directory on a disk" >&2
		disk+=" (in memory: fsync costs nothing)"
	fi
}

# build_tools: builds the load generator (into load) and mochiserver in tmp.
build_tools() {
	echo "== building"
	load="$tmp/brokerload"
	go build -o "$load" ./cmd/brokerload
	go build -o "$tmp/mochiserver" ./cmd/mochiserver
}

# assign_ports BASE: fieldgate listens on BASE+1, mochi on +2, Mosquitto on +3.
assign_ports() {
	declare -gA skip=()
	declare -gA port=([fieldgate]=$(($1 + 1)) [mochi]=$(($1 + 2)) [mosquitto]=$(($1 + 3)))
}

# wants BROKER: whether BROKERS names BROKER.
wants() { [[ " $BROKERS " == *" $1 "* ]]; }

# apt_install PACKAGE: installs a Debian package when running as root.
apt_install() {
	[ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null || return 1
	echo "== installing $1"
	export DEBIAN_FRONTEND=noninteractive
	apt-get install -y "$1" >/dev/null || { apt-get update >/dev/null && apt-get install -y "$1" >/dev/null; }
}

# build_fieldgate: runs make build for fieldgate's broker and sets
# fieldgate_version, or skips fieldgate when the build fails.
build_fieldgate() {
	local out
	fieldgate_version=unknown
	wants fieldgate || return 0
	if out=$(make -C "$root" --no-print-directory build 2>&1); then
		fieldgate_version=$("$root/bin/fieldgate" version 2>/dev/null | paste -sd' ' - || true)
	else
		echo "$out" >&2
		skip[fieldgate]="make build failed: $(grep -m1 -E 'error|\.go:[0-9]+' <<<"$out" || echo "$out" | tail -1)"
	fi
}

# find_mosquitto: sets mosquitto_bin and mosquitto_version, installing
# Debian's package as root when it is missing, or skips Mosquitto.
find_mosquitto() {
	local deb
	mosquitto_bin=
	mosquitto_version=unknown
	wants mosquitto || return 0
	mosquitto_bin=$(PATH="$PATH:/usr/sbin:/usr/local/sbin" command -v mosquitto || true)
	if [ -z "$mosquitto_bin" ] && apt_install mosquitto; then
		mosquitto_bin=$(PATH="$PATH:/usr/sbin:/usr/local/sbin" command -v mosquitto || true)
		# The package starts a service on port 1883 where an init system
		# runs; it would take CPU, and disk, from the broker under test.
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
}

# fieldgate_config DIR PORT [LINE...]: writes DIR/fieldgate.yaml: the
# broker on 127.0.0.1:PORT for anonymous clients, with each LINE added to
# its broker section, its state file in DIR, no ops endpoint and no
# sensors. The storage section comes last, for a caller to add to.
fieldgate_config() {
	local dir=$1 p=$2 line
	shift 2
	{
		echo "broker:"
		echo "  allow_anonymous: true"
		for line in "$@"; do echo "  $line"; done
		cat <<-EOF
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
	} >"$dir/fieldgate.yaml"
}

# gateway_config DIR MQTT OPS: the embedded default configuration with its
# listener on MQTT, its ops endpoint on OPS and its state in DIR, written to
# DIR/fieldgate.yaml. Fails when default.yaml no longer has the lines.
gateway_config() {
	local dir=$1 mqtt=$2 ops=$3 cfg=$1/fieldgate.yaml
	sed -e "s|address: 127\.0\.0\.1:1883\$|address: 127.0.0.1:$mqtt|" \
		-e "s|address: 127\.0\.0\.1:9100\$|address: 127.0.0.1:$ops|" \
		-e "s|^  path: fieldgate-state\.db\$|  path: $dir/state.db|" \
		"$root/gateway/config/default.yaml" >"$cfg"
	if ! grep -q "127.0.0.1:$mqtt\$" "$cfg" || ! grep -q "127.0.0.1:$ops\$" "$cfg" || ! grep -q "path: $dir/state.db\$" "$cfg"; then
		echo "gateway/config/default.yaml no longer has the listener, ops or storage lines this script moves" >&2
		return 1
	fi
}

# mosquitto_config FILE PORT [LINE...]: writes a Mosquitto configuration
# to FILE: a listener on 127.0.0.1:PORT for anonymous clients, errors and
# warnings logged to stderr, then each LINE. As root Mosquitto would switch
# to its own user and could not write to a state directory: it stays root.
mosquitto_config() {
	local file=$1 p=$2
	shift 2
	{
		if [ "$(id -u)" -eq 0 ]; then echo "user root"; fi
		echo "listener $p 127.0.0.1"
		echo "allow_anonymous true"
		echo "log_dest stderr"
		echo "log_type error"
		echo "log_type warning"
		printf '%s\n' "$@"
	} >"$file"
}

# describe_machine: the first lines of the raw output's header: CPU,
# cores, OS, architecture and Go.
describe_machine() {
	local cpu
	cpu=$(grep -m1 '^model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2- | sed 's/^ *//' || true)
	echo "cpu: ${cpu:-unknown}"
	echo "cores: $(nproc)"
	echo "goos: $(go env GOHOSTOS)"
	echo "goarch: $arch"
	echo "go: $(go env GOVERSION)"
}

# describe_module KEY MODULE: a "KEY: MODULE VERSION" line, the version of
# MODULE this module builds with.
describe_module() { echo "$1: $(go list -m -f '{{.Path}} {{.Version}}' "$2")"; }

# describe_run SETTINGS: the last lines of the raw output's header: the
# settings, the date, the load average and a "# skip" line for every
# broker that cannot run.
describe_run() {
	local b
	echo "settings: $1"
	echo "date: $(date -u +%Y-%m-%dT%H:%MZ)"
	# Anything else running shares the cores with broker and generator.
	echo "loadavg-start: $(cut -d' ' -f1-3 /proc/loadavg)"
	for b in $BROKERS; do
		if [ -n "${skip[$b]:-}" ]; then echo "# skip $b: ${skip[$b]}"; fi
	done
}

# port_busy PORT: whether something already listens on 127.0.0.1:PORT.
port_busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# port_taken BROKER: whether BROKER's port is in use by another process,
# in which case BROKER is skipped from now on.
port_taken() {
	port_busy "${port[$1]}" || return 1
	skip[$1]="port ${port[$1]} is already in use by another process"
	echo "# skip $1: ${skip[$1]}" | tee -a "$raw"
}

# log_tail FILE: the last lines of a broker log, as comments.
log_tail() { tail -n 5 "$1" 2>/dev/null | sed 's/^/#     /'; }

# broker_exited RUN HOW LOG: notes in the raw output that the broker of RUN
# (broker/scenario) exited during the run (HOW, e.g. " (status 1)"), with
# the end of its LOG.
broker_exited() {
	echo "# warn $1: the broker exited$2 during the run; its log ends:" | tee -a "$raw"
	log_tail "$3" | tee -a "$raw"
}

# check_load BROKER RC LOG: acts on the load generator's exit status RC:
# 3 (no CONNACK) skips BROKER from now on, showing the end of its LOG;
# any other failure sets status to 1.
check_load() {
	case $2 in
	0) ;;
	3)
		# The "# skip" line is in the raw output; later runs would only repeat it.
		skip[$1]="no CONNACK"
		echo "   $1 did not answer; its log ends:" >&2
		log_tail "$3" >&2
		;;
	*) status=1 ;;
	esac
}

# summarize START PART: ends the raw output, reports how long the runs
# since START (in SECONDS) took, and writes and prints the summary of PART
# (broker, storage, bridge or footprint) with cmd/benchreport.
summarize() {
	local start=$1 part=$2
	echo "loadavg-end: $(cut -d' ' -f1-3 /proc/loadavg)" >>"$raw"
	echo "== runs took $((SECONDS - start))s; raw output: ${raw#"$here/"}" >&2
	echo
	go run ./cmd/benchreport summary -o "$summary" "$part" "${raw#"$here/"}"
	echo
	echo "summary written to ${summary#"$here/"}"
}
