#!/bin/bash
# Builds the flashable SD-card image for 64-bit Raspberry Pis (3, 4, 400,
# CM4, Zero 2 W) from Debian's packages, without loop mounts:
#
#   1. mmdebstrap writes a Debian arm64 root filesystem into a directory;
#      arm64 maintainer scripts run through qemu-aarch64 and binfmt_misc;
#      customize.sh adds fieldgate and the image's own settings, and
#      raspi-firmware's kernel hook fills /boot/firmware;
#   2. /boot/firmware becomes a FAT filesystem in a plain file (mkfs.vfat,
#      mcopy), the rest an ext4 filesystem in another (mkfs.ext4 -d);
#   3. sfdisk writes an MBR partition table into the image file, dd puts
#      both filesystems at their partitions' offsets, xz compresses it.
#
# usage: build.sh OUTPUT.img.xz
# environment: FIELDGATE_DEB (the arm64 package) or FIELDGATE_BIN (an
# arm64 binary, installed by hand while there is no package); CACHE_DIR
# (downloaded packages, kept between runs); SUITE, MIRROR, SECURITY_MIRROR.
set -euo pipefail

out=${1:?usage: build.sh OUTPUT.img.xz}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
suite=${SUITE:-bookworm}
mirror=${MIRROR:-http://deb.debian.org/debian}
security=${SECURITY_MIRROR:-http://deb.debian.org/debian-security}
cache=${CACHE_DIR:-$here/../.cache/image/apt}

if [ -z "${FIELDGATE_DEB:-}" ] && [ -z "${FIELDGATE_BIN:-}" ]; then
	echo "build.sh: set FIELDGATE_DEB or FIELDGATE_BIN" >&2
	exit 2
fi
for v in FIELDGATE_DEB FIELDGATE_BIN; do
	if [ -n "${!v:-}" ]; then
		[ -f "${!v}" ] || { echo "build.sh: $v=${!v} does not exist" >&2; exit 2; }
		export "$v=$(readlink -f "${!v}")"
	fi
done
if [ "$(id -u)" -ne 0 ]; then
	# mmdebstrap's root mode, and mkfs.ext4 -d keeping every file's owner.
	echo "build.sh: run as root (make image installs nothing else as root)" >&2
	exit 2
fi

mkdir -p "$cache" "$(dirname "$out")"
cache=$(readlink -f "$cache")
work=$(mktemp -d "${TMPDIR:-/tmp}/fieldgate-image.XXXXXX")
# apt downloads as the unprivileged _apt, which must reach the lists.
chmod 0755 "$work"
cleanup() {
	# mmdebstrap unmounts what it mounted, also on failure; make sure
	# before deleting, so that rm never walks into the build machine's
	# /proc or /dev.
	if [ -d "$work/root" ]; then
		for m in $(findmnt -n -l -o TARGET | grep -F "$work/root" | sort -r); do
			umount -l "$m" || true
		done
	fi
	rm -rf "$work"
}
trap cleanup EXIT

packages=(
	systemd systemd-sysv udev dbus systemd-resolved systemd-timesyncd
	linux-image-arm64 raspi-firmware firmware-brcm80211
	openssh-server wpasupplicant iproute2 ca-certificates kmod
	e2fsprogs fdisk dosfstools device-tree-compiler
)

# Documentation, manual pages and translations are left out of the
# image; the copyright files stay.
dpkgopts=(
	--dpkgopt='path-exclude=/usr/share/man/*'
	--dpkgopt='path-exclude=/usr/share/info/*'
	--dpkgopt='path-exclude=/usr/share/doc/*'
	--dpkgopt='path-include=/usr/share/doc/*/copyright'
	--dpkgopt='path-exclude=/usr/share/locale/*'
	--dpkgopt='path-include=/usr/share/locale/locale.alias'
	--dpkgopt='path-exclude=/usr/share/lintian/*'
)

# The image's apt sources, and where it is built from: the release, its
# updates and its security updates, so that a new image has the fixes and
# a running gateway can get them. non-free-firmware holds raspi-firmware
# and the Wi-Fi firmware.
components="main non-free-firmware"
sources=(
	"deb $mirror $suite $components"
	"deb $mirror $suite-updates $components"
	"deb $security $suite-security $components"
)

echo "== mmdebstrap $suite arm64"
start=$(date +%s)
mmdebstrap --mode=root --arch=arm64 --variant=minbase \
	--include="$(IFS=,; echo "${packages[*]}")" \
	"${dpkgopts[@]}" \
	--aptopt='APT::Install-Recommends "false"' \
	--skip=essential/unlink \
	--setup-hook="mkdir -p \"\$1/var/cache/apt/archives\"" \
	--setup-hook="sync-in '$cache' /var/cache/apt/archives/" \
	--essential-hook="'$here/initramfs-once.sh' hold \"\$1\"" \
	--customize-hook="sync-out /var/cache/apt/archives '$cache'" \
	--customize-hook="'$here/customize.sh' \"\$1\"" \
	"$suite" "$work/root" "${sources[@]}"
echo "== root filesystem done in $(( $(date +%s) - start ))s"

# The boot partition's files leave the root filesystem, which keeps an
# empty /boot/firmware to mount them on.
mkdir "$work/boot"
mv "$work/root/boot/firmware/"* "$work/boot/"

mib=$((1024 * 1024))
boot_mib=256
# The root filesystem: what it holds plus a fifth and 256 MiB, so the
# first boot has room before it grows to the card.
used_mib=$(( $(du -s -B1M "$work/root" | cut -f1) ))
root_mib=$(( used_mib + used_mib / 5 + 256 ))
first_mib=4

echo "== boot partition: ${boot_mib} MiB FAT32 (FGBOOT), root: ${root_mib} MiB ext4 (fgroot) for ${used_mib} MiB of files"
mkfs.vfat -F 32 -n FGBOOT -C "$work/boot.vfat" $((boot_mib * 1024)) >/dev/null
mcopy -s -p -m -i "$work/boot.vfat" "$work/boot/"* ::/
mkfs.ext4 -q -F -L fgroot -m 2 -d "$work/root" "$work/root.ext4" "${root_mib}M"

img="$work/fieldgate.img"
truncate -s $(( (first_mib + boot_mib + root_mib) * mib )) "$img"
# W95 FAT32 (LBA), bootable, then Linux; 4 MiB aligned for SD cards'
# erase blocks.
sfdisk --quiet "$img" <<SFDISK
label: dos
unit: sectors

start=$((first_mib * 2048)), size=$((boot_mib * 2048)), type=c, bootable
start=$(((first_mib + boot_mib) * 2048)), size=$((root_mib * 2048)), type=83
SFDISK
dd if="$work/boot.vfat" of="$img" bs=1M seek="$first_mib" conv=notrunc,sparse status=none
dd if="$work/root.ext4" of="$img" bs=1M seek=$((first_mib + boot_mib)) conv=notrunc,sparse status=none
sfdisk --list "$img"

echo "== xz"
xz -T0 -6 -c "$img" >"$out.tmp"
mv -f "$out.tmp" "$out"
echo "== $out: $(du -m "$out" | cut -f1) MiB compressed, $(( $(stat -c %s "$img") / mib )) MiB raw"
