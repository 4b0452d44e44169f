package upstreamtest

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/fieldgate/fieldgate/gateway/bridge/mqttclient"
)

// TestMosquittoRestart checks the helper itself: Stop ends the broker by
// its pid, and Start brings it back on the same port with the same
// persistence, so a session survives the outage.
func TestMosquittoRestart(t *testing.T) {
	m := StartMosquitto(t, MosquittoConfig{Persistence: true})
	addr := m.Addr()
	c, err := mqttclient.Dial(context.Background(), mqttclient.Options{Address: addr, ClientID: "restart", SessionExpiry: time.Hour, ConnectTimeout: Wait, AckTimeout: Wait})
	if err != nil {
		t.Fatal(err)
	}
	if c.Info().SessionPresent {
		t.Fatal("session present on the first connection")
	}
	c.Close()
	m.Stop()
	if nc, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		nc.Close()
		t.Fatalf("%s still accepts after Stop", addr)
	}
	m.Start()
	if m.Addr() != addr {
		t.Fatalf("restarted on %s, want %s", m.Addr(), addr)
	}
	c, err = mqttclient.Dial(context.Background(), mqttclient.Options{Address: addr, ClientID: "restart", SessionExpiry: time.Hour, ConnectTimeout: Wait, AckTimeout: Wait})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if !c.Info().SessionPresent {
		t.Fatal("no session after the restart: persistence was lost")
	}
}
