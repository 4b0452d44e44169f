package broker

import (
	"net"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// TestAcceptLimitsUnsent: an accepted TCP connection holds at most
// unsentLowat unsent bytes in the kernel before its writer blocks, so a
// slow reader neither pins megabytes outside the budgets nor starves its
// writer of wake-ups.
func TestAcceptLimitsUnsent(t *testing.T) {
	nl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer nl.Close()
	l := &patientListener{Listener: nl}
	dialed := make(chan net.Conn, 1)
	go func() {
		c, err := net.Dial("tcp", nl.Addr().String())
		if err != nil {
			t.Error(err)
		}
		dialed <- c
	}()
	c, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if d := <-dialed; d != nil {
		defer d.Close()
	}
	raw, err := c.(syscall.Conn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var got int
	var gerr error
	if err := raw.Control(func(fd uintptr) {
		got, gerr = unix.GetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_NOTSENT_LOWAT)
	}); err != nil || gerr != nil {
		t.Fatal(err, gerr)
	}
	if got != unsentLowat {
		t.Errorf("TCP_NOTSENT_LOWAT is %d, want %d", got, unsentLowat)
	}
}
