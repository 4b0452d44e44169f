#!/bin/bash
# mmdebstrap's customize hook for the SD-card image (see build.sh): runs on
# the build machine with the finished root filesystem at $1; commands
# that must run as arm64 run in it through chroot, which qemu-aarch64
# carries out through binfmt_misc.
#
# Environment: FIELDGATE_DEB, the package to install, or, for an image
# without it, FIELDGATE_BIN, an arm64 binary installed by hand with the
# units from systemd/.
set -euo pipefail

root=$1
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(dirname "$here")

in_root() { chroot "$root" "$@"; }

# fieldgate itself.
install_fieldgate() {
	if [ -n "${FIELDGATE_DEB:-}" ]; then
		# The package: dpkg -i, with apt fetching anything it depends on.
		cp "$FIELDGATE_DEB" "$root/tmp/fieldgate.deb"
		in_root apt-get install -y --no-install-recommends /tmp/fieldgate.deb
		rm -f "$root/tmp/fieldgate.deb"
	else
		# Stand-in for the package: what its maintainer scripts do, from
		# systemd/README.md, minus what needs a running system.
		install -D -m 0755 "$FIELDGATE_BIN" "$root/usr/bin/fieldgate"
		install -D -m 0644 "$repo/systemd/fieldgate.service" "$root/usr/lib/systemd/system/fieldgate.service"
		install -D -m 0644 "$repo/systemd/fieldgate.socket" "$root/usr/lib/systemd/system/fieldgate.socket"
		install -D -m 0644 "$repo/systemd/fieldgate.sysusers" "$root/usr/lib/sysusers.d/fieldgate.conf"
		install -D -m 0644 "$repo/systemd/60-fieldgate-gpio.rules" "$root/usr/lib/udev/rules.d/60-fieldgate-gpio.rules"
		in_root systemd-sysusers fieldgate.conf
		in_root systemctl enable fieldgate.service
	fi
	if [ ! -e "$root/etc/fieldgate/fieldgate.yaml" ]; then
		install -D -m 0644 "$here/fieldgate-default.yaml" "$root/etc/fieldgate/fieldgate.yaml"
	fi
	in_root fieldgate check -config /etc/fieldgate/fieldgate.yaml
}

# The image's own files: first-boot units and scripts, journald, network.
cp -r --no-preserve=ownership "$here/rootfs/." "$root/"

install_fieldgate

# Both groups exist whether or not a package created them.
for group in i2c gpio; do
	in_root getent group "$group" >/dev/null || in_root groupadd --system "$group"
done

# The filesystems by label, so that the same image boots from an SD card
# (mmcblk0), a USB disk (sda) and the emulator's virtio disk (vda).
# noatime: no write to the card for every read, the state database's
# included.
cat >"$root/etc/fstab" <<'FSTAB'
# <file system>  <mount point>   <type>  <options>                          <dump> <pass>
LABEL=fgroot     /               ext4    noatime,errors=remount-ro          0      1
LABEL=FGBOOT     /boot/firmware  vfat    noatime,umask=0022,fmask=0022      0      2
FSTAB

echo fieldgate >"$root/etc/hostname"
cat >"$root/etc/hosts" <<'HOSTS'
127.0.0.1	localhost
::1		localhost ip6-localhost ip6-loopback
127.0.1.1	fieldgate
HOSTS

# /dev/i2c-N exists only with i2c-dev loaded.
echo i2c-dev >"$root/etc/modules-load.d/fieldgate-image.conf"

# A persistent journal (capped in journald.conf.d).
mkdir -p "$root/var/log/journal"

in_root systemctl enable systemd-networkd.service systemd-resolved.service \
	systemd-timesyncd.service fieldgate-boot-config.service \
	fieldgate-grow-root.service fieldgate-ssh-keys.service ssh.service

# Nothing that must differ between gateways is baked in: the SSH host
# keys come at first boot, the machine id too (systemd's first boot).
rm -f "$root"/etc/ssh/ssh_host_*
echo uninitialized >"$root/etc/machine-id"
rm -f "$root/var/lib/dbus/machine-id"

# The boot partition: raspi-firmware's kernel hook fills /boot/firmware
# with the firmware, the kernel, the initrd and the device trees, and
# writes config.txt (with raspi-firmware-custom appended) and
# cmdline.txt, from /etc/default/raspi-firmware.
sed -i -e '/^ROOTPART=/d' -e '/^CONSOLES=/d' "$root/etc/default/raspi-firmware"
cat >>"$root/etc/default/raspi-firmware" <<'DEFAULTS'

# fieldgate image: the root filesystem by label (see /etc/fstab), the
# serial console on the GPIO header's UART and the screen.
ROOTPART=LABEL=fgroot
CONSOLES="tty0 ttyS1,115200"
DEFAULTS
# The initramfs, held back during the install (initramfs-once.sh); its
# post-update hook runs raspi-firmware's too.
"$here/initramfs-once.sh" release "$root"
kernel=$(find "$root/boot" -maxdepth 1 -name 'vmlinuz-*' -printf '%f\n' | sort -V | tail -1)
in_root env DEB_MAINT_PARAMS=configure /etc/kernel/postinst.d/z50-raspi-firmware "${kernel#vmlinuz-}"
# 1-Wire on GPIO 4, in the device trees raspi-firmware's hook copied,
# and after every later copy: the kernel's and the initramfs's hooks run
# in name order, so z60 comes after raspi-firmware's z50.
for hooks in /etc/kernel/postinst.d /etc/initramfs/post-update.d; do
	mkdir -p "$root$hooks"
	ln -sf /usr/lib/fieldgate-image/w1-gpio-dtb "$root$hooks/z60-fieldgate-w1-gpio"
done
in_root /usr/lib/fieldgate-image/w1-gpio-dtb --strict
for f in config.txt cmdline.txt start4.elf bootcode.bin "$kernel"; do
	[ -s "$root/boot/firmware/$f" ] || { echo "customize: /boot/firmware/$f is missing" >&2; exit 1; }
done
