package broker

import (
	"context"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/fieldgate/fieldgate/internal/testkit"
)

// testBroker is a broker on real loopback sockets for one test.
type testBroker struct {
	*Broker
	Addr string // host:port of the tcp listener
}

// startBroker starts a broker with the default configuration, anonymous
// access and one TCP listener on a free loopback port; edit changes the
// options first (it may add listeners). The broker shuts down with the test.
func startBroker(t testing.TB, edit func(*Options)) *testBroker {
	t.Helper()
	opts := Options{Config: DefaultConfig(), Version: "test"}
	opts.AllowAnonymous = true
	opts.SysInterval = 0
	opts.Listeners = []Listener{{Name: "tcp", Type: ListenerTCP, Address: "127.0.0.1:0"}}
	if edit != nil {
		edit(&opts)
	}
	var log *slog.Logger
	if os.Getenv("FIELDGATE_TEST_LOG") != "" {
		log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	b, err := New(opts, log)
	if err != nil {
		t.Fatalf("broker.New: %v", err)
	}
	if err := b.Start(); err != nil {
		t.Fatalf("broker.Start: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), testkit.Scale(10*time.Second))
		defer cancel()
		if err := b.Shutdown(ctx); err != nil {
			t.Errorf("broker.Shutdown: %v", err)
		}
	})
	tb := &testBroker{Broker: b}
	if a := b.Addr("tcp"); a != nil {
		tb.Addr = a.String()
	}
	return tb
}
