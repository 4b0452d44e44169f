package broker

import (
	"net"

	"golang.org/x/sys/unix"
)

// unsentLowat is TCP_NOTSENT_LOWAT for every accepted TCP connection: the
// most the kernel holds that it has not sent yet. Without it Linux grows a
// slow reader's send buffer towards net.ipv4.tcp_wmem's maximum (4 MiB on
// most systems), memory outside every budget the broker keeps, and wakes a
// blocked writer only once half of that has drained, which for a client
// reading a few kilobytes a second takes longer than writeTimeout: a slow
// but live subscriber was disconnected as if it were gone. With it the
// writer wakes as the client reads, and what waits beyond the budgets is
// this much plus what the client's window lets through. The send buffer
// still grows for fast clients, so throughput is kept.
const unsentLowat = 64 << 10

// limitUnsent sets TCP_NOTSENT_LOWAT on c; a kernel without it (before
// 3.12) keeps its default.
func limitUnsent(c *net.TCPConn) {
	raw, err := c.SyscallConn()
	if err != nil {
		return
	}
	_ = raw.Control(func(fd uintptr) {
		_ = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_NOTSENT_LOWAT, unsentLowat)
	})
}
