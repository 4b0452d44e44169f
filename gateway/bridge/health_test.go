package bridge

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"testing"

	"github.com/fieldgate/fieldgate/gateway/bridge/mqttclient"
	"github.com/fieldgate/fieldgate/internal/mqttwire"
)

// TestServerRefused: which ends of a link put the message it was reading
// under suspicion, and which kinds of failure the log takes as the same.
func TestServerRefused(t *testing.T) {
	reset := fmt.Errorf("bridge: connection to x lost: %w", &net.OpError{Op: "read", Err: os.NewSyscallError("read", syscall.ECONNRESET)})
	pipe := fmt.Errorf("bridge: connection to x lost: %w", &net.OpError{Op: "write", Err: os.NewSyscallError("write", syscall.EPIPE)})
	for _, tc := range []struct {
		name    string
		err     error
		refused bool
		kind    string
	}{
		{"our close", nil, false, "closed by us"},
		{"end of file", fmt.Errorf("bridge: x closed the connection: %w", io.EOF), true, "closed by the server"},
		{"reset", reset, true, "closed by the server"},
		{"broken pipe", pipe, true, "closed by the server"},
		{"topic name invalid", fmt.Errorf("bridge: x: %w", &mqttclient.DisconnectError{Code: 0x90}), true, "disconnect 0x90"},
		{"not authorized", &mqttclient.DisconnectError{Code: 0x87, Reason: "acl"}, true, "disconnect 0x87"},
		{"qos not supported", &mqttclient.DisconnectError{Code: 0x9B}, true, "disconnect 0x9B"},
		{"session taken over", &mqttclient.DisconnectError{Code: 0x8E}, false, "disconnect 0x8E"},
		{"server shutting down", &mqttclient.DisconnectError{Code: 0x8B}, false, "disconnect 0x8B"},
		{"normal disconnection", &mqttclient.DisconnectError{Code: 0x00}, false, "disconnect 0x00"},
		{"half-open", fmt.Errorf("%w: no PUBACK for packet id 7", mqttclient.ErrHalfOpen), false, "half-open"},
		{"protocol error", mqttwire.Errorf(0x82, "the server sent CONNECT"), false, "protocol error 0x82"},
		{"refused", &mqttclient.RefusedError{Version: 4, Code: 5}, false, "refused 4/0x05"},
		{"dial refused", &net.OpError{Op: "dial", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}, false, "connection refused"},
	} {
		if got := serverRefused(tc.err); got != tc.refused {
			t.Errorf("%s: serverRefused %v, want %v", tc.name, got, tc.refused)
		}
		if got := failureKind(tc.err); got != tc.kind {
			t.Errorf("%s: failureKind %q, want %q", tc.name, got, tc.kind)
		}
	}
	if errors.Is(reset, io.EOF) {
		t.Fatal("the test's reset is an end of file")
	}
}
