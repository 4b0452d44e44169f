#!/bin/bash
# Builds the initramfs once instead of twice. Under qemu-user emulation
# mkinitramfs takes minutes (it runs modprobe and friends for each of
# hundreds of modules, each a new emulated process), and a plain install
# runs it twice: once in the kernel's postinst and again when dpkg
# processes initramfs-tools' trigger at the end.
#
#   initramfs-once.sh hold ROOT     (mmdebstrap --essential-hook) diverts
#                                   update-initramfs to a stub that does
#                                   nothing, before the kernel is installed
#   initramfs-once.sh release ROOT  (customize.sh) puts the real one back
#                                   and builds the initramfs of every
#                                   installed kernel, once
set -euo pipefail

mode=${1:?usage: initramfs-once.sh hold|release ROOT}
root=${2:?usage: initramfs-once.sh hold|release ROOT}
tool=/usr/sbin/update-initramfs

case "$mode" in
hold)
	chroot "$root" dpkg-divert --quiet --local --rename --divert "$tool.fieldgate-image" --add "$tool"
	printf '#!/bin/sh\necho "update-initramfs: held until the image is customized" >&2\n' >"$root$tool"
	chmod 755 "$root$tool"
	;;
release)
	rm -f "$root$tool"
	chroot "$root" dpkg-divert --quiet --local --rename --divert "$tool.fieldgate-image" --remove "$tool"
	# -c for each kernel: runs the post-update hooks too, raspi-firmware's
	# among them, which copies the new initrd to /boot/firmware.
	for kernel in $(find "$root/boot" -maxdepth 1 -name 'vmlinuz-*' -printf '%f\n' | sort -V); do
		chroot "$root" update-initramfs -c -k "${kernel#vmlinuz-}"
	done
	;;
*)
	echo "usage: initramfs-once.sh hold|release ROOT" >&2
	exit 2
	;;
esac
