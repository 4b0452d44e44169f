package testkit

import (
	"net"
	"testing"
)

// FreeAddr returns a 127.0.0.1 host:port that nothing listens on: for a
// server a test starts later, or for an address a test wants refused.
// The port is free when FreeAddr returns; the kernel hands out ports in
// turn, so it is not given again soon.
func FreeAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}
