package broker

import (
	"context"
	"crypto/tls"
	"errors"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fieldgate/fieldgate/internal/testkit"
	"github.com/fieldgate/fieldgate/internal/testkit/certs"
)

// unbindable is an address no test machine has (TEST-NET-1, RFC 5737):
// binding it fails, so a listener configured with it serves only if the
// inherited socket took its place.
const unbindable = "192.0.2.1:1883"

// closedByBroker reports whether l was closed, waiting briefly for an
// Accept rather than forever.
func closedByBroker(l net.Listener) error {
	_ = l.(interface{ SetDeadline(time.Time) error }).SetDeadline(time.Now().Add(testkit.Scale(time.Second)))
	_, err := l.Accept()
	return err
}

func mustListen(t *testing.T, network, addr string) net.Listener {
	t.Helper()
	l, err := net.Listen(network, addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// TestInheritedListeners: a socket passed as systemd passes one replaces
// the bind of the listener of the same name, for every listener type, and
// real MQTT clients connect through it.
func TestInheritedListeners(t *testing.T) {
	pki := certs.New(t, "sensor-7")
	tlsFiles := TLS{Cert: pki.ServerCert, Key: pki.ServerKey}
	clientTLS := &tls.Config{RootCAs: pki.Pool, ServerName: "127.0.0.1"}
	dir, err := os.MkdirTemp("", "inh")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "mqtt.sock")

	inherited := map[string]net.Listener{
		"default": mustListen(t, "tcp", "127.0.0.1:0"),
		"tls":     mustListen(t, "tcp", "127.0.0.1:0"),
		"ws":      mustListen(t, "tcp", "127.0.0.1:0"),
		"wss":     mustListen(t, "tcp", "127.0.0.1:0"),
		"unix":    mustListen(t, "unix", sock),
		"stray":   mustListen(t, "tcp", "127.0.0.1:0"),
	}
	var logs testkit.Buffer
	opts := Options{Config: DefaultConfig(), Version: "test", Inherited: inherited}
	opts.AllowAnonymous = true
	opts.SysInterval = 0
	opts.Listeners = []Listener{
		{Name: "default", Type: ListenerTCP, Address: unbindable},
		{Name: "tls", Type: ListenerTLS, Address: unbindable, TLS: tlsFiles},
		{Name: "ws", Type: ListenerWS, Address: unbindable},
		{Name: "wss", Type: ListenerWSS, Address: unbindable, TLS: tlsFiles},
		{Name: "unix", Type: ListenerUnix, Address: filepath.Join(dir, "no-such-dir", "mqtt.sock")},
	}
	b, err := New(opts, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Start(); err != nil {
		t.Fatalf("Start with inherited sockets: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), testkit.Scale(10*time.Second))
		defer cancel()
		if err := b.Shutdown(ctx); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
	})

	for name, l := range inherited {
		if name == "stray" {
			continue
		}
		if got, want := b.Addr(name).String(), l.Addr().String(); got != want {
			t.Errorf("Addr(%q) = %s, want the inherited socket's %s", name, got, want)
		}
	}
	addr := func(name string) string { return inherited[name].Addr().String() }
	dial := map[string]func(t *testing.T) net.Conn{
		"default": func(t *testing.T) net.Conn { return mustDial(t, "tcp", addr("default")) },
		"tls": func(t *testing.T) net.Conn {
			c, err := tls.Dial("tcp", addr("tls"), clientTLS)
			if err != nil {
				t.Fatal(err)
			}
			return c
		},
		"ws":   func(t *testing.T) net.Conn { return dialWS(t, "ws://"+addr("ws")+"/mqtt", nil) },
		"wss":  func(t *testing.T) net.Conn { return dialWS(t, "wss://"+addr("wss")+"/mqtt", clientTLS) },
		"unix": func(t *testing.T) net.Conn { return mustDial(t, "unix", sock) },
	}
	for _, name := range []string{"default", "tls", "ws", "wss", "unix"} {
		t.Run(name, func(t *testing.T) {
			sub, got := lsConnect(t, dial[name](t), name+"-sub", "")
			pub, _ := lsConnect(t, dial["default"](t), name+"-pub", "")
			lsRoundTrip(t, sub, got, pub, "inherited/"+name)
		})
	}

	// A socket no listener names is closed, and the log says which.
	t.Run("stray", func(t *testing.T) {
		if err := closedByBroker(inherited["stray"]); !errors.Is(err, net.ErrClosed) {
			t.Fatalf("Accept on the unclaimed socket = %v, want net.ErrClosed", err)
		}
		if l := logs.String(); !strings.Contains(l, "name=stray") || !strings.Contains(l, "closing a socket passed by systemd") {
			t.Fatalf("log does not name the closed socket:\n%s", l)
		}
	})
}

// TestInheritedWrongNetwork: a TCP socket for a unix listener is a unit
// that does not match the configuration; Start refuses it, names the
// listener, and leaves no inherited socket open.
func TestInheritedWrongNetwork(t *testing.T) {
	wrong := mustListen(t, "tcp", "127.0.0.1:0")
	later := mustListen(t, "tcp", "127.0.0.1:0")
	b, err := New(Options{Config: DefaultConfig(),
		Listeners: []Listener{
			{Name: "local", Type: ListenerUnix, Address: filepath.Join(t.TempDir(), "mqtt.sock")},
			{Name: "default", Type: ListenerTCP, Address: "127.0.0.1:0"},
		},
		Inherited: map[string]net.Listener{"local": wrong, "default": later},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = b.Start()
	if err == nil || !strings.Contains(err.Error(), `listener "local"`) || !strings.Contains(err.Error(), "tcp socket") {
		t.Fatalf("Start = %v, want an error naming listener \"local\" and the tcp socket", err)
	}
	for name, l := range map[string]net.Listener{"local": wrong, "default": later} {
		if err := closedByBroker(l); !errors.Is(err, net.ErrClosed) {
			t.Errorf("inherited %q after the failed Start: Accept = %v, want net.ErrClosed", name, err)
		}
	}
	_ = b.Shutdown(context.Background())
}
