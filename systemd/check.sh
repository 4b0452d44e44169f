#!/usr/bin/env bash
# Checks the files in this directory the way systemd will read them, on a
# machine or container where systemd is installed but need not be running:
#
#   1. systemd-analyze verify on fieldgate.service and fieldgate.socket.
#      verify insists that ExecStart's binary exists, and fieldgate is not
#      installed at /usr/bin/fieldgate on a build machine, so the units are
#      copied to a temporary directory (under the same names, which pairs
#      the socket with the service) with ExecStart pointing at the binary
#      just built; every other line is checked as shipped. --root= is no
#      way around it: it wants a whole unit tree and /bin/kill inside the
#      root. --man=no and --generators=no keep verify from looking for man
#      pages and running generators, neither of which a container has.
#      verify reports unknown keys and bad values as warnings and still
#      exits 0, so any diagnostic at all fails the check.
#   2. systemd-sysusers --dry-run on fieldgate.sysusers in an empty root.
#   3. systemd-analyze security --offline=true on the service: prints the
#      findings and the exposure score, and fails above MAX_EXPOSURE.
#
# usage: systemd/check.sh BINARY
set -euo pipefail

# The score systemd-analyze prints, times ten; the unit scores 1.7.
MAX_EXPOSURE=20

bin=$(realpath "${1:?usage: $0 path/to/fieldgate}")
here=$(cd "$(dirname "$0")" && pwd)

# Debian packages: systemd-analyze and systemd-sysusers come with systemd,
# /bin/kill (ExecReload) with procps.
missing=""
{ command -v systemd-analyze >/dev/null && command -v systemd-sysusers >/dev/null; } || missing+=" systemd"
[ -x /bin/kill ] || missing+=" procps"
if [ -n "$missing" ]; then
	if [ "$(id -u)" -ne 0 ]; then
		echo "missing Debian packages:$missing; run: sudo apt-get update && sudo apt-get install -y$missing" >&2
		exit 1
	fi
	export DEBIAN_FRONTEND=noninteractive
	apt-get install -y $missing || { apt-get update && apt-get install -y $missing; }
fi
systemd-analyze --version | head -n 1

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cp "$here/fieldgate.service" "$here/fieldgate.socket" "$tmp/"
sed -i "s|^ExecStart=/usr/bin/fieldgate |ExecStart=$bin |" "$tmp/fieldgate.service"
grep -q "^ExecStart=$bin " "$tmp/fieldgate.service" || {
	echo "systemd-check: fieldgate.service has no 'ExecStart=/usr/bin/fieldgate ' line to point at $bin" >&2
	exit 1
}

status=0
echo "+ systemd-analyze verify --man=no --generators=no fieldgate.service fieldgate.socket"
if ! out=$(systemd-analyze verify --man=no --generators=no \
	"$tmp/fieldgate.service" "$tmp/fieldgate.socket" 2>&1) || [ -n "$out" ]; then
	echo "$out" | sed "s|$tmp/||g"
	echo "systemd-check: verify reported the problems above"
	status=1
fi

echo "+ systemd-sysusers --dry-run fieldgate.sysusers"
mkdir "$tmp/root"
if ! systemd-sysusers --dry-run --root="$tmp/root" "$here/fieldgate.sysusers" 2>&1; then
	echo "systemd-check: fieldgate.sysusers does not parse"
	status=1
fi

echo "+ systemd-analyze security --offline=true fieldgate.service"
report=$(systemd-analyze security --offline=true --no-pager "$tmp/fieldgate.service" 2>&1) || true
# Only what is exposed, and the verdict; the full table has 80 lines of ✓.
grep -E '^✗|Overall exposure' <<<"$report" || { echo "$report"; status=1; }
if ! systemd-analyze security --offline=true --threshold=$MAX_EXPOSURE "$tmp/fieldgate.service" >/dev/null 2>&1; then
	echo "systemd-check: exposure above $((MAX_EXPOSURE / 10)).$((MAX_EXPOSURE % 10)); harden the unit or raise MAX_EXPOSURE with a reason"
	status=1
fi
exit $status
