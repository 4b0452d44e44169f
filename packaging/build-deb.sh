#!/usr/bin/env bash
# Builds fieldgate's .deb for each ARCH=BINARY given, with dpkg-deb alone,
# into OUTDIR/fieldgate_VERSION_ARCH.deb (any older package of that
# architecture there is removed first, so one remains per architecture).
#
#   usage: packaging/build-deb.sh OUTDIR ARCH=BINARY...
#   e.g.   packaging/build-deb.sh bin arm64=bin/fieldgate-linux-arm64 armhf=bin/fieldgate-linux-armv6
#
# The package:
#   /usr/bin/fieldgate                           the static binary given
#   /usr/lib/systemd/system/fieldgate.{service,socket}
#   /usr/lib/sysusers.d/fieldgate.conf           systemd/fieldgate.sysusers
#   /usr/lib/udev/rules.d/60-fieldgate-gpio.rules
#   /etc/fieldgate/fieldgate.yaml                packaging/fieldgate.yaml, a conffile
#   /usr/share/man/man1/fieldgate.1.gz           packaging/fieldgate.1
#   /usr/share/doc/fieldgate/copyright           packaging/copyright.sh
#   /usr/share/doc/fieldgate/changelog.Debian.gz
#   /usr/share/lintian/overrides/fieldgate       packaging/deb/lintian-overrides
#   maintainer scripts                           packaging/deb/{postinst,prerm,postrm}
#
# Environment:
#   DEB_VERSION     the package version; default: packaging/version.sh
#   DEB_MAINTAINER  the Maintainer field; the default is a placeholder
#                   address (.invalid, RFC 2606): set a real one to publish
#
# Each binary must be built for its architecture (armhf: GOARM=6, so that
# the package runs on ARMv6 boards too) without cgo; the script reads that
# from the binary and refuses one that is not. The packages are
# reproducible: file times, the changelog's date and the archive's are
# those of the commit built, and every entry is owned by root.
set -euo pipefail
export LC_ALL=C

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)

fail() {
	echo "build-deb.sh: $*" >&2
	exit 1
}

[ $# -ge 2 ] || fail "usage: $0 OUTDIR ARCH=BINARY..."
out=$1
shift
mkdir -p "$out"

version=${DEB_VERSION:-$(bash "$here/version.sh")}
dpkg --validate-version "$version" || fail "DEB_VERSION '$version' is not a Debian version"
maintainer=${DEB_MAINTAINER:-The fieldgate authors <packages@fieldgate.invalid>}

# Times from the commit, for reproducible packages; now, outside git.
if epoch=$(git -C "$repo" log -1 --format=%ct 2>/dev/null); then
	commit=$(git -C "$repo" rev-parse HEAD)
else
	epoch=$(date +%s)
	commit=unknown
fi
export SOURCE_DATE_EPOCH=$epoch

# check_binary ARCH BINARY fails unless BINARY is a static Go binary for ARCH.
check_binary() {
	local arch=$1 bin=$2 want_goarch want_goarm="" settings
	case "$arch" in
	amd64) want_goarch=amd64 ;;
	arm64) want_goarch=arm64 ;;
	armhf) want_goarch=arm want_goarm=6 ;;
	*) fail "no build is known for the Debian architecture '$arch'" ;;
	esac
	settings=$(go version -m "$bin" | awk -F'\t' '$2 == "build" { print $3 }') ||
		fail "$bin: not a Go binary"
	grep -qx "GOARCH=$want_goarch" <<<"$settings" || fail "$bin is not built for GOARCH=$want_goarch ($arch)"
	grep -qx "CGO_ENABLED=0" <<<"$settings" || fail "$bin is built with cgo: the packages carry static binaries"
	if [ -n "$want_goarm" ]; then
		grep -qx "GOARM=$want_goarm" <<<"$settings" ||
			fail "$bin is not built with GOARM=$want_goarm: the armhf package must run on ARMv6 (Pi Zero, Pi 1)"
	fi
}

# control ARCH STAGE writes the package's control file.
control() {
	local arch=$1 stage=$2 size
	size=$(du -sk --apparent-size --exclude=DEBIAN "$stage" | cut -f1)
	cat <<CONTROL
Package: fieldgate
Version: $version
Architecture: $arch
Maintainer: $maintainer
Installed-Size: $size
Recommends: systemd
Section: net
Priority: optional
Description: MQTT edge gateway for Raspberry Pi-class boards
 fieldgate reads the sensors wired to the board (I2C, GPIO, 1-Wire),
 serves the MQTT devices of the local network through its own broker
 (MQTT 3.1.1 and 5.0), keeps sessions and queued messages in one file
 that survives power cuts, and bridges chosen topics to cloud brokers
 through an outbox that rides out network outages.
 .
 The package enables and starts a hardened systemd service that listens
 on 127.0.0.1 only until /etc/fieldgate/fieldgate.yaml says otherwise.
CONTROL
}

# man_page FILE prints the manual page with this build's date and version
# in its title line, where the source leaves them empty.
man_page() {
	local title='.TH FIELDGATE 1 "" "fieldgate"'
	[ "$(head -n 1 "$1")" = "$title \"User Commands\"" ] ||
		fail "$1: the first line is not '$title \"User Commands\"'"
	echo ".TH FIELDGATE 1 \"$(date -u -d "@$SOURCE_DATE_EPOCH" +%Y-%m-%d)\" \"fieldgate $version\" \"User Commands\""
	tail -n +2 "$1"
}

# changelog writes the changelog entry of this build.
changelog() {
	local date described
	date=$(date -u -R -d "@$SOURCE_DATE_EPOCH")
	described=$(git -C "$repo" describe --tags --always --dirty 2>/dev/null || echo unknown)
	cat <<CHANGELOG
fieldgate ($version) unstable; urgency=medium

  * Built from commit $commit ($described).
    The history of changes is that of the fieldgate repository.

 -- $maintainer  $date
CHANGELOG
}

for pair in "$@"; do
	arch=${pair%%=*}
	bin=${pair#*=}
	if [ "$arch" = "$pair" ] || [ ! -f "$bin" ]; then
		fail "want ARCH=BINARY with an existing binary, got '$pair'"
	fi
	check_binary "$arch" "$bin"

	stage="$out/deb/fieldgate_${version}_$arch"
	rm -rf "$stage"
	install -D -m 0755 "$bin" "$stage/usr/bin/fieldgate"
	install -D -m 0644 -t "$stage/usr/lib/systemd/system" "$repo/systemd/fieldgate.service" "$repo/systemd/fieldgate.socket"
	install -D -m 0644 "$repo/systemd/fieldgate.sysusers" "$stage/usr/lib/sysusers.d/fieldgate.conf"
	install -D -m 0644 -t "$stage/usr/lib/udev/rules.d" "$repo/systemd/60-fieldgate-gpio.rules"
	install -D -m 0644 "$here/fieldgate.yaml" "$stage/etc/fieldgate/fieldgate.yaml"
	install -d -m 0755 "$stage/usr/share/man/man1" "$stage/usr/share/doc/fieldgate"
	man_page "$here/fieldgate.1" | gzip -9n >"$stage/usr/share/man/man1/fieldgate.1.gz"
	bash "$here/copyright.sh" "$bin" >"$stage/usr/share/doc/fieldgate/copyright"
	changelog | gzip -9n >"$stage/usr/share/doc/fieldgate/changelog.Debian.gz"
	install -D -m 0644 "$here/deb/lintian-overrides" "$stage/usr/share/lintian/overrides/fieldgate"

	install -d -m 0755 "$stage/DEBIAN"
	install -m 0755 -t "$stage/DEBIAN" "$here/deb/postinst" "$here/deb/prerm" "$here/deb/postrm"
	echo /etc/fieldgate/fieldgate.yaml >"$stage/DEBIAN/conffiles"
	(cd "$stage" && find . -path ./DEBIAN -prune -o -type f -printf '%P\0' | sort -z | xargs -0 md5sum) >"$stage/DEBIAN/md5sums"
	control "$arch" "$stage" >"$stage/DEBIAN/control"
	chmod 0644 "$stage/DEBIAN/control" "$stage/DEBIAN/conffiles" "$stage/DEBIAN/md5sums"
	find "$stage" -type d -exec chmod 0755 {} +
	find "$stage" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +

	rm -f "$out"/fieldgate_*_"$arch".deb
	deb="$out/fieldgate_${version}_$arch.deb"
	dpkg-deb --root-owner-group -Zxz --build "$stage" "$deb" >/dev/null
	rm -rf "$stage"
	echo "$deb: $(stat -c %s "$deb") bytes, /usr/bin/fieldgate $(stat -c %s "$bin") bytes"
done
rmdir "$out/deb" 2>/dev/null || true
