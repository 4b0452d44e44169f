package mosquitto

import (
	"context"
	"crypto/tls"
	"net"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	"github.com/fieldgate/fieldgate/internal/testkit"
)

// connect opens an MQTT 5 session as id on addr that outlives its
// connection, disconnects, and reports whether the broker still had the
// session.
func connect(t *testing.T, addr, id string) (present bool) {
	t.Helper()
	wait := testkit.Scale(10 * time.Second)
	nc, err := net.DialTimeout("tcp", addr, wait)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	c := paho.NewClient(paho.ClientConfig{Conn: nc, PacketTimeout: wait})
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	expiry := uint32(3600)
	ack, err := c.Connect(ctx, &paho.Connect{ClientID: id, KeepAlive: 30, Properties: &paho.ConnectProperties{SessionExpiryInterval: &expiry}})
	if err != nil {
		nc.Close()
		t.Fatalf("connect %q to %s: %v", id, addr, err)
	}
	_ = c.Disconnect(&paho.Disconnect{})
	return ack.SessionPresent
}

// TestRestart checks that Stop ends the broker and Start brings it back on
// the same port with the same persistence, so a session survives the
// outage.
func TestRestart(t *testing.T) {
	m := Start(t, Config{Persistence: true})
	addr := m.Addr()
	if connect(t, addr, "restart") {
		t.Fatal("session present on the first connection")
	}
	m.Stop()
	if nc, err := net.DialTimeout("tcp", addr, testkit.Scale(time.Second)); err == nil {
		nc.Close()
		t.Fatalf("%s still accepts after Stop", addr)
	}
	m.Start()
	if m.Addr() != addr {
		t.Fatalf("restarted on %s, want %s", m.Addr(), addr)
	}
	if !connect(t, addr, "restart") {
		t.Fatal("no session after the restart: persistence was lost")
	}
}

// TestWipeAside checks the faults of a cloud broker: Aside serves the
// stopped broker's state on another port while Addr stays down, and
// after Wipe the state is gone.
func TestWipeAside(t *testing.T) {
	m := Start(t, Cloud())
	connect(t, m.Addr(), "kept")
	m.Stop()
	m.Aside(func(addr string) {
		if addr == m.Addr() {
			t.Fatalf("Aside on the broker's own address %s", addr)
		}
		if nc, err := net.DialTimeout("tcp", m.Addr(), testkit.Scale(time.Second)); err == nil {
			nc.Close()
			t.Fatalf("%s accepts during Aside", m.Addr())
		}
		if !connect(t, addr, "kept") {
			t.Fatal("Aside does not serve the stopped broker's state")
		}
	})
	m.Wipe()
	m.Start()
	if connect(t, m.Addr(), "kept") {
		t.Fatal("session present after Wipe")
	}
}

// TestTLS checks the TLS listener against the test CA, with a client
// certificate required.
func TestTLS(t *testing.T) {
	m := Start(t, Config{TLS: true, RequireCertificate: true})
	wait := testkit.Scale(10 * time.Second)
	for _, withCert := range []bool{true, false} {
		nc, err := net.DialTimeout("tcp", m.TLSAddr(), wait)
		if err != nil {
			t.Fatal(err)
		}
		c := tls.Client(nc, m.ClientTLS("localhost", withCert))
		// The CONNECT goes out after the handshake; TLS 1.3 tells of a
		// refused client certificate only when the client reads.
		p := paho.NewClient(paho.ClientConfig{Conn: c, PacketTimeout: wait})
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		_, err = p.Connect(ctx, &paho.Connect{ClientID: "tls", CleanStart: true, KeepAlive: 30})
		cancel()
		if err == nil {
			_ = p.Disconnect(&paho.Disconnect{})
		}
		c.Close()
		if withCert && err != nil {
			t.Errorf("with the client certificate: %v", err)
		}
		if !withCert && err == nil {
			t.Error("without a client certificate: accepted")
		}
	}
}
