package broker

import (
	"context"
	"log/slog"
	"net"
	"strings"
	"testing"

	"github.com/fieldgate/fieldgate/internal/testkit"
)

// TestStartWarnsOfAnonymousNetworkListeners: Start logs a warning for a
// listener that admits anonymous clients on an address other hosts can
// reach, judged by the socket really served: a configured wildcard
// address, or a socket systemd passed in place of a loopback one, which no
// check of the file can see. Loopback sockets, and anonymous access off,
// log none.
func TestStartWarnsOfAnonymousNetworkListeners(t *testing.T) {
	for _, c := range []struct {
		name      string
		anonymous bool
		address   string // configured
		inherited string // bound in advance as systemd would, "" for none
		want      string // in the warning; "" for no warning
	}{
		{"configured on every address", true, "0.0.0.0:0", "", "the configuration"},
		{"socket activation on every address", true, "127.0.0.1:1883", "0.0.0.0:0", "a socket passed by systemd (socket activation), in place of the configured 127.0.0.1:1883"},
		{"socket activation on loopback", true, "0.0.0.0:1883", "127.0.0.1:0", ""},
		{"configured on loopback", true, "127.0.0.1:0", "", ""},
		{"credentials required", false, "0.0.0.0:0", "", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			var logged testkit.Buffer
			opts := Options{Config: DefaultConfig(), Listeners: []Listener{{Name: "default", Type: ListenerTCP, Address: c.address}}}
			opts.AllowAnonymous = c.anonymous
			opts.SysInterval = 0
			if c.inherited != "" {
				opts.Inherited = map[string]net.Listener{"default": mustListen(t, "tcp", c.inherited)}
			}
			b, err := New(opts, slog.New(slog.NewTextHandler(&logged, &slog.HandlerOptions{Level: slog.LevelWarn})))
			if err != nil {
				t.Fatal(err)
			}
			if err := b.Start(); err != nil {
				t.Fatal(err)
			}
			defer b.Shutdown(context.Background())
			out := logged.String()
			switch {
			case c.want == "" && strings.Contains(out, "SECURITY"):
				t.Errorf("warned:\n%s", out)
			case c.want != "" && (!strings.Contains(out, "level=WARN msg=\"SECURITY: anonymous clients can connect from the network") ||
				!strings.Contains(out, "key=listeners[0].address") || !strings.Contains(out, c.want)):
				t.Errorf("log:\n%s\nwant a SECURITY warning naming listeners[0].address and %q", out, c.want)
			}
		})
	}
}
