#!/bin/bash
# Makes this machine run arm64 binaries transparently: mmdebstrap runs the
# arm64 packages' maintainer scripts (and the kernel's initramfs hook) in
# the new root filesystem, and that needs the kernel's binfmt_misc to hand
# aarch64 ELF files to qemu-aarch64-static.
#
# A container often starts without binfmt_misc mounted, so the
# registration that qemu-user-static's package makes at install time
# silently did not happen. As root this mounts it and registers
# qemu-aarch64 with the F (fix binary) flag: the kernel opens the
# interpreter once, now, so it also works inside the chroot, which has no
# qemu of its own. The registration belongs to the kernel, not to this
# container, and lasts until reboot.
set -euo pipefail

works() { arch-test arm64 >/dev/null 2>&1; }

if works; then
	echo "binfmt: arm64 binaries run here (qemu-aarch64 through binfmt_misc)"
	exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
	echo "binfmt: arm64 binaries do not run here; as root run: mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc; update-binfmts --enable qemu-aarch64" >&2
	exit 1
fi
dir=/proc/sys/fs/binfmt_misc
if [ ! -e "$dir/register" ]; then
	echo "binfmt: mounting binfmt_misc on $dir"
	mount -t binfmt_misc binfmt_misc "$dir"
fi
if [ ! -e "$dir/qemu-aarch64" ]; then
	echo "binfmt: registering qemu-aarch64"
	update-binfmts --enable qemu-aarch64 || update-binfmts --import qemu-aarch64
fi
if ! works; then
	echo "binfmt: arm64 binaries still do not run; binfmt_misc says:" >&2
	cat "$dir/qemu-aarch64" >&2 || true
	exit 1
fi
echo "binfmt: arm64 binaries run here (qemu-aarch64 through binfmt_misc)"
