#!/usr/bin/env bash
# Checks the packages `make deb` built; what `make deb-check` runs after it.
#
#   usage: packaging/check-deb.sh DEB...
#
# For each package:
#   - its control fields against its file name, and no Depends (the binary
#     is static; systemd is only Recommended: see packaging/README.md);
#   - its file list, owners and modes, exactly;
#   - conffiles lists /etc/fieldgate/fieldgate.yaml, the maintainer
#     scripts parse, md5sums matches the files;
#   - unpacked with dpkg-deb -x: the binary is a stripped static ELF for the
#     package's architecture (per `file`) built as `make cross` builds (per
#     `go version -m`: no cgo, -trimpath, armhf with GOARM=6; and stamped
#     with a version), and it runs: `version` and
#     `check` on the packaged configuration, natively or under qemu user
#     emulation, the armhf one on an emulated ARMv6 (ARM1176) core;
#   - the units, the sysusers file, the udev rule and the configuration are
#     the repository's; the copyright file names every module the binary
#     links; the changelog carries the package's version.
# Then, once, on the packages' common parts:
#   - the maintainer scripts, rehearsed as in an image build: unpacked into
#     a scratch root and run there with DPKG_ROOT set (what dpkg --root
#     does) and the real systemd-sysusers and deb-systemd-helper:
#     configure, an upgrade, an upgrade after the administrator disabled the
#     service, remove and purge. DPKG_ROOT keeps every action inside the
#     scratch root; nothing is started, stopped or created on this machine;
#   - the packaging is reproducible: the amd64 package built again from its
#     own binary is the same file, byte for byte;
#   - shellcheck on the packaging scripts;
#   - lintian on every package: any error or warning, or an override that no
#     longer matches, fails.
set -euo pipefail
export LC_ALL=C

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)

[ $# -ge 1 ] || {
	echo "usage: $0 DEB..." >&2
	exit 2
}

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

status=0
problem() {
	echo "deb-check: $*" >&2
	status=1
}

# The files every package holds, with their modes; directories are
# root-owned 0755.
expected_files() {
	cat <<'FILES'
-rw-r--r-- ./etc/fieldgate/fieldgate.yaml
-rwxr-xr-x ./usr/bin/fieldgate
-rw-r--r-- ./usr/lib/systemd/system/fieldgate.service
-rw-r--r-- ./usr/lib/systemd/system/fieldgate.socket
-rw-r--r-- ./usr/lib/sysusers.d/fieldgate.conf
-rw-r--r-- ./usr/lib/udev/rules.d/60-fieldgate-gpio.rules
-rw-r--r-- ./usr/share/doc/fieldgate/changelog.Debian.gz
-rw-r--r-- ./usr/share/doc/fieldgate/copyright
-rw-r--r-- ./usr/share/lintian/overrides/fieldgate
-rw-r--r-- ./usr/share/man/man1/fieldgate.1.gz
FILES
}

# run_packaged ARCH BINARY ARGS... runs a packaged binary on this machine.
run_packaged() {
	local arch=$1 bin=$2
	shift 2
	case "$arch/$(dpkg --print-architecture)" in
	amd64/amd64 | arm64/arm64) "$bin" "$@" ;;
	amd64/*) qemu-x86_64-static "$bin" "$@" ;;
	arm64/*) qemu-aarch64-static "$bin" "$@" ;;
	# The Pi Zero and Pi 1 core: the package's promise to ARMv6 boards.
	armhf/*) qemu-arm-static -cpu arm1176 "$bin" "$@" ;;
	*) "$bin" "$@" ;;
	esac
}

check_package() {
	local deb=$1 name arch version dir root
	name=$(basename "$deb" .deb)
	if [[ ! $name =~ ^fieldgate_([^_]+)_([a-z0-9]+)$ ]]; then
		problem "$deb: not named fieldgate_VERSION_ARCH.deb"
		return
	fi
	version=${BASH_REMATCH[1]}
	arch=${BASH_REMATCH[2]}
	echo "== $name"
	dir="$tmp/$arch"
	root="$dir/root"
	mkdir -p "$dir"

	# Control fields.
	dpkg-deb --info "$deb" | sed 's/^/  /'
	local field want
	for pair in "Package=fieldgate" "Version=$version" "Architecture=$arch" "Recommends=systemd" "Depends="; do
		field=${pair%%=*} want=${pair#*=}
		[ "$(dpkg-deb --field "$deb" "$field")" = "$want" ] ||
			problem "$name: $field is '$(dpkg-deb --field "$deb" "$field")', want '$want'"
	done
	dpkg --validate-version "$version" || problem "$name: '$version' is not a Debian version"

	# Contents: paths, modes and owners.
	local listing
	listing=$(dpkg-deb --contents "$deb")
	if ! diff -u <(expected_files | sort -k2) <(awk '$1 ~ /^-/ { print $1, $6 }' <<<"$listing" | sort -k2); then
		problem "$name: the files differ from the expected list (- expected, + packaged)"
	fi
	awk '$2 != "root/root" { print "  " $0 }' <<<"$listing" | grep . && problem "$name: entries not owned by root/root"
	awk '$1 ~ /^d/ && $1 != "drwxr-xr-x" { print "  " $0 }' <<<"$listing" | grep . && problem "$name: directories not 0755"
	awk '$1 !~ /^[-d]/ { print "  " $0 }' <<<"$listing" | grep . && problem "$name: entries that are neither files nor directories"

	# Control area.
	dpkg-deb --control "$deb" "$dir/DEBIAN"
	[ "$(cat "$dir/DEBIAN/conffiles")" = /etc/fieldgate/fieldgate.yaml ] ||
		problem "$name: conffiles is '$(cat "$dir/DEBIAN/conffiles")', want /etc/fieldgate/fieldgate.yaml"
	for script in postinst prerm postrm; do
		[ -x "$dir/DEBIAN/$script" ] || problem "$name: $script missing or not executable"
		cmp -s "$dir/DEBIAN/$script" "$here/deb/$script" || problem "$name: $script is not packaging/deb/$script"
		bash -n "$dir/DEBIAN/$script" || problem "$name: $script does not parse"
	done

	# Unpacked.
	dpkg-deb -x "$deb" "$root"
	(cd "$root" && md5sum --quiet -c "$dir/DEBIAN/md5sums") || problem "$name: md5sums does not match the files"

	local bin="$root/usr/bin/fieldgate" described want_file settings
	described=$(file -b "$bin")
	echo "  file: $described"
	case "$arch" in
	amd64) want_file="ELF 64-bit LSB executable, x86-64" ;;
	arm64) want_file="ELF 64-bit LSB executable, ARM aarch64" ;;
	armhf) want_file="ELF 32-bit LSB executable, ARM, EABI5" ;;
	*) want_file="(no expectation for $arch)" ;;
	esac
	[[ $described == "$want_file"* ]] || problem "$name: file says '$described', want '$want_file...'"
	[[ $described == *"statically linked"* ]] || problem "$name: the binary is not statically linked"
	[[ $described == *", stripped"* ]] || problem "$name: the binary is not stripped"

	settings=$(go version -m "$bin" | awk -F'\t' '$2 == "build" { print $3 }')
	local want_settings=("CGO_ENABLED=0" "-trimpath=true")
	case "$arch" in
	amd64) want_settings+=("GOARCH=amd64") ;;
	arm64) want_settings+=("GOARCH=arm64") ;;
	armhf) want_settings+=("GOARCH=arm" "GOARM=6") ;;
	esac
	for s in "${want_settings[@]}"; do
		grep -qxF -- "$s" <<<"$settings" || problem "$name: the binary was not built with $s"
	done

	local out
	if out=$(run_packaged "$arch" "$bin" version 2>&1); then
		echo "  version: $(tr '\n' ' ' <<<"$out")"
		# make cross stamps the version; -trimpath keeps -ldflags out of the
		# build settings, so this is where the stamp shows.
		grep -q "^fieldgate dev " <<<"$out" && problem "$name: the binary carries no version stamp"
		[ "$arch" != armhf ] || grep -q "GOARM=6" <<<"$out" || problem "$name: version does not report GOARM=6"
	else
		problem "$name: the packaged binary does not run: $out"
	fi
	if out=$(run_packaged "$arch" "$bin" check -config "$root/etc/fieldgate/fieldgate.yaml" 2>&1); then
		echo "  check: $out"
	else
		problem "$name: check of the packaged configuration failed: $out"
	fi

	# The files the repository holds, as they are there.
	for pair in \
		usr/lib/systemd/system/fieldgate.service=systemd/fieldgate.service \
		usr/lib/systemd/system/fieldgate.socket=systemd/fieldgate.socket \
		usr/lib/sysusers.d/fieldgate.conf=systemd/fieldgate.sysusers \
		usr/lib/udev/rules.d/60-fieldgate-gpio.rules=systemd/60-fieldgate-gpio.rules \
		etc/fieldgate/fieldgate.yaml=packaging/fieldgate.yaml \
		usr/share/lintian/overrides/fieldgate=packaging/deb/lintian-overrides; do
		cmp -s "$root/${pair%%=*}" "$repo/${pair#*=}" || problem "$name: /${pair%%=*} is not ${pair#*=}"
	done

	# The copyright file covers what the binary links.
	local copyright="$root/usr/share/doc/fieldgate/copyright" module
	head -n 1 "$copyright" | grep -qx 'Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/' ||
		problem "$name: the copyright file is not in the machine-readable format"
	for module in std $(go version -m "$bin" | awk -F'\t' '$2 == "dep" { print $3 }'); do
		grep -Eq "^Files: (.* )?$module/\*( |\$)" "$copyright" || problem "$name: the copyright file has no paragraph for $module"
	done

	# The changelog is the package's.
	gzip -t "$root/usr/share/doc/fieldgate/changelog.Debian.gz" || problem "$name: changelog.Debian.gz is not valid gzip"
	zcat "$root/usr/share/doc/fieldgate/changelog.Debian.gz" | head -n 1 | grep -qF "fieldgate ($version) " ||
		problem "$name: the changelog's first entry is not for $version"
}

# rehearse ROOT runs the maintainer scripts in ROOT, an unpacked package,
# as dpkg --root would, and checks what they leave there.
rehearse() {
	local root=$1 scripts=$2 wants="$1/etc/systemd/system/multi-user.target.wants"
	echo "== maintainer scripts, with DPKG_ROOT=$root"
	local missing=""
	for tool in systemd-sysusers deb-systemd-helper; do
		command -v "$tool" >/dev/null || missing+=" $tool"
	done
	if [ -n "$missing" ]; then
		problem "the rehearsal needs$missing (Debian packages systemd and init-system-helpers)"
		return
	fi
	maint() { # maint SCRIPT ARGS...
		local script=$1
		shift
		echo "  + $script $*"
		DPKG_ROOT=$root DPKG_MAINTSCRIPT_PACKAGE=fieldgate DPKG_MAINTSCRIPT_NAME=$script \
			"$scripts/$script" "$@" 2>&1 | sed 's/^/    /'
	}

	maint postinst configure || problem "postinst configure failed"
	for group in i2c gpio; do
		grep -q "^$group:" "$root/etc/group" || problem "postinst configure did not create the group $group"
	done
	[ "$(readlink "$wants/fieldgate.service")" = /usr/lib/systemd/system/fieldgate.service ] ||
		problem "postinst configure did not enable fieldgate.service"
	[ ! -e "$root/etc/systemd/system/sockets.target.wants/fieldgate.socket" ] ||
		problem "postinst configure enabled fieldgate.socket, which is left to the administrator"

	maint postinst configure 0.0~old-1 || problem "postinst configure (an upgrade) failed"
	[ -L "$wants/fieldgate.service" ] || problem "an upgrade disabled fieldgate.service"

	rm "$wants/fieldgate.service" # what systemctl disable does
	maint postinst configure 0.0~old-1 || problem "postinst configure (an upgrade) failed"
	[ ! -e "$wants/fieldgate.service" ] || problem "an upgrade enabled fieldgate.service again after the administrator disabled it"
	ln -s /usr/lib/systemd/system/fieldgate.service "$wants/fieldgate.service" # systemctl enable

	# The state as systemd leaves it with DynamicUser=.
	mkdir -p "$root/var/lib/private/fieldgate"
	touch "$root/var/lib/private/fieldgate/state.db"
	ln -s private/fieldgate "$root/var/lib/fieldgate"

	maint prerm remove || problem "prerm remove failed"
	maint postrm remove || problem "postrm remove failed"
	[ -e "$root/var/lib/private/fieldgate/state.db" ] || problem "postrm remove deleted the state"
	local said
	said=$(maint postrm purge) || problem "postrm purge failed"
	echo "$said"
	if [ -e "$root/var/lib/private/fieldgate" ] || [ -L "$root/var/lib/fieldgate" ]; then
		problem "postrm purge left the state in /var/lib/private/fieldgate or /var/lib/fieldgate"
	fi
	grep -q "deleting the gateway's state" <<<"$said" || problem "postrm purge deleted the state without saying so"
	[ ! -e "$wants/fieldgate.service" ] || problem "postrm purge left fieldgate.service enabled"
	[ -z "$(ls -A "$root/var/lib/systemd/deb-systemd-helper-enabled" 2>/dev/null)" ] ||
		problem "postrm purge left deb-systemd-helper state behind"
}

for deb in "$@"; do
	check_package "$deb"
done

amd64=""
for deb in "$@"; do
	[[ $deb == *_amd64.deb ]] && amd64=$deb
done
if [ -n "$amd64" ]; then
	rehearse "$tmp/amd64/root" "$tmp/amd64/DEBIAN"

	echo "== reproducible: $(basename "$amd64") built again"
	mkdir "$tmp/again"
	DEB_VERSION=$(dpkg-deb --field "$amd64" Version) \
		DEB_MAINTAINER=$(dpkg-deb --field "$amd64" Maintainer) \
		bash "$here/build-deb.sh" "$tmp/again" "amd64=$tmp/amd64/root/usr/bin/fieldgate" | sed 's/^/  /'
	cmp "$amd64" "$tmp/again/$(basename "$amd64")" || problem "building the amd64 package again gave another file"
else
	problem "no amd64 package: the maintainer scripts and reproducibility are checked on it"
fi

echo "== shellcheck"
shellcheck "$here"/*.sh "$here"/deb/postinst "$here"/deb/prerm "$here"/deb/postrm || problem "shellcheck found the problems above"

echo "== lintian"
# --fail-on: errors and warnings fail; overrides silence them. unused-override
# is only an info tag, so it is looked for.
if ! report=$(lintian --display-info --fail-on error,warning "$@" 2>&1); then
	problem "lintian found errors or warnings that are not overridden"
fi
grep -v '^running with root privileges' <<<"$report" | sed 's/^/  /' || true
grep -q 'unused-override' <<<"$report" && problem "an override in packaging/deb/lintian-overrides matches nothing: remove it"

if [ "$status" -eq 0 ]; then
	echo "deb-check: $# packages pass"
fi
exit $status
