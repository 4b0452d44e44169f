package broker

import (
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// TestAcceptCapsSendBuffer: an accepted connection's kernel send buffer
// is capped, so a slow reader cannot pin megabytes outside the budgets.
func TestAcceptCapsSendBuffer(t *testing.T) {
	for _, network := range []string{"tcp", "unix"} {
		// A unix socket keeps the kernel's default, which does not grow.
		addr := "127.0.0.1:0"
		if network == "unix" {
			addr = t.TempDir() + "/s"
		}
		nl, err := net.Listen(network, addr)
		if err != nil {
			t.Fatal(err)
		}
		l := &patientListener{Listener: nl}
		dialed := make(chan net.Conn, 1)
		go func() {
			c, err := net.Dial(network, nl.Addr().String())
			if err != nil {
				t.Error(err)
			}
			dialed <- c
		}()
		c, err := l.Accept()
		if err != nil {
			t.Fatal(err)
		}
		raw, err := c.(syscall.Conn).SyscallConn()
		if err != nil {
			t.Fatal(err)
		}
		var size int
		var serr error
		if err := raw.Control(func(fd uintptr) { size, serr = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUF) }); err != nil || serr != nil {
			t.Fatal(err, serr)
		}
		// Linux reports twice what was set, clamped to wmem_max; setting
		// it also ends the kernel's growing of the buffer.
		want := 2 * min(sendBuffer, wmemMax(t))
		if network == "unix" {
			want = wmemDefault(t)
		}
		if size != want {
			t.Errorf("%s: SO_SNDBUF is %d, want %d", network, size, want)
		}
		c.Close()
		if d := <-dialed; d != nil {
			d.Close()
		}
		nl.Close()
	}
}

// wmemMax is net.core.wmem_max, the most SO_SNDBUF may be set to.
func wmemMax(t *testing.T) int { return sysctlInt(t, "wmem_max") }

// wmemDefault is net.core.wmem_default, a unix socket's SO_SNDBUF.
func wmemDefault(t *testing.T) int { return sysctlInt(t, "wmem_default") }

func sysctlInt(t *testing.T, name string) int {
	b, err := os.ReadFile("/proc/sys/net/core/" + name)
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	return n
}
