#!/bin/bash
# Boots the SD-card image under qemu-system-aarch64 (-M virt, software
# emulation, no KVM) and checks it from this machine:
#
#   - the first-boot files this test puts on the boot partition
#     (fieldgate.yaml, mqtt-users.txt, authorized_keys, hostname) are
#     applied, and the root partition grows into the space added behind it;
#   - systemd reports fieldgate.service active, which for Type=notify
#     means fieldgate sent READY=1;
#   - an MQTT client here, through the port forwarded to the guest's
#     1883, is refused without credentials and, as the user
#     mqtt-users.txt created, receives the simulated sensors' readings
#     under the gateway.name of the test's configuration;
#   - a retained message survives a reboot; on that reboot an invalid
#     fieldgate.yaml is rejected with fieldgate-error.txt and the
#     previous configuration stays.
#
# The virt machine has no Raspberry Pi firmware: the test starts the
# image's own kernel and initrd (taken from the boot partition) with the
# image's own cmdline.txt, its consoles swapped for the virt machine's
# serial port. Root and /boot/firmware are found by label, so the
# virtio disk (vda) boots the same way as the SD card (mmcblk0).
#
# usage: test.sh IMAGE.img.xz
# environment: BOOT_TIMEOUT (seconds, default 900), QEMU_CPU (cortex-a53),
# QEMU_MEM (MiB, default 1024: a Pi 3), QEMU_SMP (2).
set -euo pipefail

image=${1:?usage: test.sh IMAGE.img.xz}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(dirname "$here")
boot_timeout=${BOOT_TIMEOUT:-900}
cpu=${QEMU_CPU:-cortex-a53}
mem=${QEMU_MEM:-1024}
smp=${QEMU_SMP:-2}
name=fg-image-test
host=fgtest

for tool in qemu-system-aarch64 xz sfdisk mcopy mtype mdir fdtget ssh ssh-keygen mosquitto_sub mosquitto_pub; do
	command -v "$tool" >/dev/null || { echo "image-test: $tool is missing (make image-packages)" >&2; exit 2; }
done

work=$(mktemp -d "${TMPDIR:-/tmp}/fieldgate-image-test.XXXXXX")
qemu_pid=""
stop_qemu() {
	if [ -n "$qemu_pid" ] && kill -0 "$qemu_pid" 2>/dev/null; then
		kill "$qemu_pid" 2>/dev/null || true
		for _ in $(seq 50); do kill -0 "$qemu_pid" 2>/dev/null || break; sleep 0.2; done
		kill -9 "$qemu_pid" 2>/dev/null || true
		wait "$qemu_pid" 2>/dev/null || true
	fi
	qemu_pid=""
}
cleanup() {
	local rc=$?
	stop_qemu
	if [ "$rc" -ne 0 ] && [ -f "$work/console.log" ]; then
		echo "== image-test failed; the last lines of the serial console:"
		tail -n 60 "$work/console.log" | tr -d '\r' || true
	fi
	rm -rf "$work"
}
trap cleanup EXIT

t0=$(date +%s)
elapsed() { echo "$(( $(date +%s) - t0 ))s"; }
fail() { echo "image-test: FAIL: $*" >&2; exit 1; }
ok() { echo "image-test: ok: $*"; }
indent() { sed 's/^/   /'; }

echo "== unpacking $image"
disk="$work/disk.img"
xz -dc "$image" >"$disk"
raw_bytes=$(stat -c %s "$disk")
# Room for the first boot to grow the root partition into, as on a card
# larger than the image.
truncate -s +1G "$disk"

# The boot partition, by its offset in the image file (mtools reads a
# filesystem at IMAGE@@OFFSET).
boot_start=$(sfdisk --dump "$disk" | awk -F'[=,]' '$1 ~ /img1 *: start/ {gsub(/ /, "", $2); print $2}')
[ -n "$boot_start" ] || fail "no first partition in the image"
bootfs="$disk@@$((boot_start * 512))"
kernel=$(mdir -b -i "$bootfs" ::/ | sed -n 's|^::/\(vmlinuz-.*\)|\1|p' | sort -V | tail -1)
initrd=$(mdir -b -i "$bootfs" ::/ | sed -n 's|^::/\(initrd.img-.*\)|\1|p' | sort -V | tail -1)
if [ -z "$kernel" ] || [ -z "$initrd" ]; then fail "no kernel or initrd on the boot partition"; fi
mcopy -n -i "$bootfs" "::/$kernel" "$work/vmlinuz"
mcopy -n -i "$bootfs" "::/$initrd" "$work/initrd.img"
cmdline=$(mtype -i "$bootfs" ::/cmdline.txt | tr -d '\r\n')
grep -q 'dtparam=i2c_arm=on' <(mtype -i "$bootfs" ::/config.txt) || fail "config.txt lacks dtparam=i2c_arm=on"
# 1-Wire: every Raspberry Pi device tree has a w1-gpio node on GPIO 4
# whose gpios refer to the tree's own GPIO controller.
dtbs=$(mdir -b -i "$bootfs" ::/ | sed -n 's#^::/\(bcm2\(711\|837\|710\)-rpi-.*\.dtb\)$#\1#p')
[ "$(grep -c . <<<"$dtbs")" -ge 8 ] || fail "fewer than 8 Raspberry Pi device trees on the boot partition: $dtbs"
for dtb in $dtbs; do
	mcopy -n -i "$bootfs" "::/$dtb" "$work/$dtb"
	[ "$(fdtget "$work/$dtb" /onewire compatible 2>/dev/null)" = w1-gpio ] || fail "$dtb has no w1-gpio node"
	want="$(fdtget -t u "$work/$dtb" /soc/gpio@7e200000 phandle) 4 0"
	[ "$(fdtget -t u "$work/$dtb" /onewire gpios)" = "$want" ] || fail "$dtb: w1-gpio is not on GPIO 4 of /soc/gpio@7e200000"
done
ok "config.txt enables I2C; $(grep -c . <<<"$dtbs") device trees have 1-Wire on GPIO 4; cmdline.txt: $cmdline"
# The Pi's consoles (tty0, the header's UART ttyS1) become virt's PL011.
append="$(sed -E 's/(^| )console=[^ ]*//g' <<<"$cmdline") console=ttyAMA0,115200"

# The first-boot files: the embedded default configuration (simulated
# sensors) with a name and a listener on every address, so that the
# forwarded port reaches it, with anonymous access off and the password
# file that mqtt-users.txt fills, as the README tells a user to open the
# broker to the network; a key for ssh; a host name.
sed -e '/^  path: fieldgate-state.db/d' \
	-e 's|address: 127.0.0.1:1883|address: 0.0.0.0:1883|' \
	-e 's|^  allow_anonymous: true|  allow_anonymous: false\n  password_file: /etc/fieldgate/passwd|' \
	-e "s|^gateway:|gateway:\n  name: $name|" \
	"$repo/gateway/config/default.yaml" >"$work/fieldgate.yaml"
for want in "name: $name" 'allow_anonymous: false' 'password_file: /etc/fieldgate/passwd' 'address: 0.0.0.0:1883'; do
	grep -q "$want" "$work/fieldgate.yaml" || fail "could not derive the test configuration ($want)"
done
mqtt_user="image-test"
mqtt_pw="pw-$RANDOM$RANDOM$RANDOM"
printf '# the first user\n%s:%s\n' "$mqtt_user" "$mqtt_pw" >"$work/mqtt-users.txt"
mqtt_auth=(-u "$mqtt_user" -P "$mqtt_pw")
ssh-keygen -q -t ed25519 -N '' -C image-test -f "$work/key"
cp "$work/key.pub" "$work/authorized_keys"
echo "$host" >"$work/hostname"
mcopy -o -i "$bootfs" "$work/fieldgate.yaml" "$work/mqtt-users.txt" "$work/authorized_keys" "$work/hostname" ::/

free_port() {
	local p
	while :; do
		p=$(( 20000 + RANDOM % 20000 ))
		ss -Htln "sport = :$p" | grep -q . || { echo "$p"; return; }
	done
}
mqtt_port=$(free_port)
ssh_port=$(free_port)
while [ "$ssh_port" = "$mqtt_port" ]; do ssh_port=$(free_port); done

echo "== booting under qemu-system-aarch64 -M virt -cpu $cpu -smp $smp -m $mem (MQTT on 127.0.0.1:$mqtt_port, ssh on $ssh_port)"
qemu-system-aarch64 -M virt -cpu "$cpu" -smp "$smp" -m "$mem" \
	-display none -monitor none -serial "file:$work/console.log" \
	-kernel "$work/vmlinuz" -initrd "$work/initrd.img" -append "$append" \
	-drive if=none,id=disk0,file="$disk",format=raw \
	-device virtio-blk-pci,drive=disk0 \
	-netdev "user,id=net0,hostfwd=tcp:127.0.0.1:$mqtt_port-:1883,hostfwd=tcp:127.0.0.1:$ssh_port-:22" \
	-device virtio-net-pci,netdev=net0,romfile= \
	-device virtio-rng-pci &
qemu_pid=$!

# guest COMMAND...: runs COMMAND (one shell line, as ssh makes of its
# arguments) on the guest. A connection that goes quiet, as one does
# when the guest reboots under it, ends within seconds, and no command
# waits longer than 2 minutes.
guest() {
	timeout 120 ssh -q -i "$work/key" -p "$ssh_port" -o BatchMode=yes -o ConnectTimeout=10 \
		-o ServerAliveInterval=5 -o ServerAliveCountMax=3 \
		-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR \
		root@127.0.0.1 "$@"
}

# wait_for_boot OLD_BOOT_ID: until ssh answers from a boot other than
# OLD_BOOT_ID and fieldgate.service has left activating.
wait_for_boot() {
	local old=$1 start deadline id state
	start=$(date +%s)
	deadline=$(( start + boot_timeout ))
	while :; do
		kill -0 "$qemu_pid" 2>/dev/null || fail "the emulator exited"
		[ "$(date +%s)" -lt "$deadline" ] || fail "no ssh within ${boot_timeout}s"
		if id=$(guest cat /proc/sys/kernel/random/boot_id 2>/dev/null) && [ -n "$id" ] && [ "$id" != "$old" ]; then
			break
		fi
		sleep 5
	done
	echo "   ssh answers after $(( $(date +%s) - start ))s (boot $id)"
	while :; do
		state=$(guest systemctl is-active fieldgate.service || true)
		case "$state" in
		active) break ;;
		activating | inactive | "") ;;
		*) guest systemctl status --no-pager fieldgate.service || true; fail "fieldgate.service is $state" ;;
		esac
		[ "$(date +%s)" -lt "$deadline" ] || fail "fieldgate.service still $state after ${boot_timeout}s"
		sleep 3
	done
	echo "   fieldgate.service active after $(( $(date +%s) - start ))s"
	boot_id=$id
}

boot_id=none
wait_for_boot "$boot_id"
boot1=$(elapsed)

# READY: a Type=notify service is active only once it sent READY=1;
# systemd's "Started" line is written at that moment.
show=$(guest systemctl show -p Type -p ActiveState -p SubState -p StatusText -p NRestarts fieldgate.service)
indent <<<"$show"
for want in Type=notify ActiveState=active SubState=running; do
	grep -qx "$want" <<<"$show" || fail "fieldgate.service: want $want"
done
guest journalctl -b -o cat -u fieldgate.service | grep -q '^Started fieldgate' || fail "no 'Started fieldgate' in the journal"
ok "fieldgate.service is active after READY=1 ($(grep '^StatusText=' <<<"$show"))"

# The first-boot files were applied and removed from the boot partition.
guest test ! -e /boot/firmware/fieldgate.yaml -a ! -e /boot/firmware/mqtt-users.txt -a ! -e /boot/firmware/authorized_keys -a ! -e /boot/firmware/hostname \
	|| fail "first-boot files are still on the boot partition"
guest "grep -q '^$mqtt_user:\\\$2' /etc/fieldgate/passwd && test \"\$(stat -c %a /etc/fieldgate/passwd)\" = 644" \
	|| fail "mqtt-users.txt did not put $mqtt_user's bcrypt hash in /etc/fieldgate/passwd, readable by the service"
guest "grep -q 'name: $name' /etc/fieldgate/fieldgate.yaml" || fail "/etc/fieldgate/fieldgate.yaml is not the test's"
[ "$(guest hostname)" = "$host" ] || fail "host name is $(guest hostname), not $host"
ok "boot-partition files applied: fieldgate.yaml, mqtt-users.txt ($mqtt_user), authorized_keys, hostname ($host)"

# The root partition grew into the added gigabyte; mounts and groups.
root_mib=$(guest df -B1M --output=size / | tail -1 | tr -d ' ')
[ "$root_mib" -gt $(( raw_bytes / 1048576 )) ] || fail "root filesystem is ${root_mib} MiB: it did not grow"
guest findmnt -n -o OPTIONS / | grep -q noatime || fail "/ is not mounted noatime"
guest findmnt -n -o SOURCE,FSTYPE /boot/firmware | grep -q vfat || fail "/boot/firmware is not mounted"
guest getent group i2c gpio | grep -c . | grep -qx 2 || fail "the i2c and gpio groups are missing"
guest test -d /var/log/journal || fail "the journal is not persistent"
guest 'modinfo -n w1-gpio && modinfo -n w1_therm && test -x /etc/kernel/postinst.d/z60-fieldgate-w1-gpio && test -x /etc/initramfs/post-update.d/z60-fieldgate-w1-gpio' >/dev/null \
	|| fail "the 1-Wire modules or the device-tree hooks are missing"
guest grep -q -- '-security' /etc/apt/sources.list || fail "no security updates in the apt sources"
ok "root grew to ${root_mib} MiB, mounted noatime; /boot/firmware mounted; groups i2c and gpio; persistent journal"

# Readings over MQTT, from here, under the configured name.
refused=$(mosquitto_sub -h 127.0.0.1 -p "$mqtt_port" -t "fieldgate/$name/#" -C 1 -W 10 2>&1 || true)
grep -qi 'refused' <<<"$refused" || fail "a client without credentials was not refused on the network listener: $refused"
ok "a client without credentials is refused: $refused"
readings=$(mosquitto_sub "${mqtt_auth[@]}" -h 127.0.0.1 -p "$mqtt_port" -t "fieldgate/$name/#" -v -C 40 -W 60 || true)
echo "$readings" | grep '"value"' | head -5 | indent
grep -q "^fieldgate/$name/climate/temperature {\"value\":" <<<"$readings" || fail "no climate temperature reading under fieldgate/$name"
count=$(grep -c "^fieldgate/$name/[a-z_]*/[a-z_]* {\"value\":" <<<"$readings" || true)
ok "$count readings received over MQTT on the forwarded port, under fieldgate/$name"
guest systemctl show -p StatusText fieldgate.service | indent

token="kept-$RANDOM$RANDOM"
mosquitto_pub "${mqtt_auth[@]}" -h 127.0.0.1 -p "$mqtt_port" -q 1 -r -t "image-test/retained" -m "$token"
got=$(mosquitto_sub "${mqtt_auth[@]}" -h 127.0.0.1 -p "$mqtt_port" -t "image-test/retained" -C 1 -W 10 || true)
[ "$got" = "$token" ] || fail "retained message not read back before the reboot (got '$got')"

# Memory after boot: fieldgate's resident set, the system's use.
mem_report() {
	# shellcheck disable=SC2016 # expanded in the guest
	guest 'pid=$(systemctl show -p MainPID --value fieldgate.service)
		awk "/^VmRSS/ {printf \"fieldgate RSS %d MiB (%d kB)\n\", \$2/1024, \$2}" /proc/$pid/status
		awk "/^MemTotal/ {t=\$2} /^MemAvailable/ {a=\$2} END {printf \"system used %d MiB of %d MiB (MemTotal - MemAvailable)\n\", (t-a)/1024, t/1024}" /proc/meminfo
		echo "fieldgate.service cgroup memory $(( $(systemctl show -p MemoryCurrent --value fieldgate.service) / 1048576 )) MiB"'
}
mem_report | indent

# Reboot with an invalid fieldgate.yaml waiting on the boot partition.
guest "printf 'log:\n  level: loud\n' >/boot/firmware/fieldgate.yaml && sync"
echo "== rebooting"
guest systemctl reboot || true
wait_for_boot "$boot_id"
boot2=$(elapsed)

guest test -e /boot/firmware/fieldgate.yaml.rejected || fail "the invalid fieldgate.yaml was not set aside"
errtext=$(guest cat /boot/firmware/fieldgate-error.txt) || fail "no fieldgate-error.txt on the boot partition"
indent <<<"$errtext"
grep -q 'log.level' <<<"$errtext" || fail "fieldgate-error.txt does not give the reason"
guest "grep -q 'name: $name' /etc/fieldgate/fieldgate.yaml" || fail "the previous configuration was not kept"
ok "an invalid fieldgate.yaml is rejected with its reason in fieldgate-error.txt, the previous one kept"

got=$(mosquitto_sub "${mqtt_auth[@]}" -h 127.0.0.1 -p "$mqtt_port" -t "image-test/retained" -C 1 -W 30 || true)
[ "$got" = "$token" ] || fail "the retained message did not survive the reboot (got '$got')"
readings=$(mosquitto_sub "${mqtt_auth[@]}" -h 127.0.0.1 -p "$mqtt_port" -t "fieldgate/$name/climate/temperature" -C 1 -W 60 || true)
[ -n "$readings" ] || fail "no readings after the reboot"
ok "the retained message survived the reboot; readings flow again"
guest journalctl --disk-usage | indent
[ "$(guest journalctl --list-boots --no-pager | grep -c .)" -ge 2 ] || fail "the journal did not keep the first boot"
ok "the journal kept both boots"
mem_report | indent

echo "== powering off"
guest systemctl poweroff || true
for _ in $(seq 60); do kill -0 "$qemu_pid" 2>/dev/null || break; sleep 1; done
stop_qemu
echo "image-test: PASS (first boot ready at $boot1, second at $boot2, all done in $(elapsed))"
