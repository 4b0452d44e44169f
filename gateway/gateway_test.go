package gateway

import (
	"bytes"
	"context"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/fieldgate/fieldgate/gateway/config"
	"github.com/fieldgate/fieldgate/internal/testkit"
)

func TestRunReturnsWhenContextCancelled(t *testing.T) {
	// Read only after Run has returned, so a plain buffer is safe.
	var out bytes.Buffer
	log := slog.New(slog.NewTextHandler(&out, nil))
	ctx, cancel := context.WithCancel(context.Background())

	done := make(chan error, 1)
	cfg := config.Default()
	cfg.Listeners[0].Address = "127.0.0.1:0"
	// The default ops port is the one cmd/fieldgate's tests of the
	// embedded defaults bind, perhaps at this moment.
	cfg.Ops.Address = ""
	cfg.Storage.Path = t.TempDir() + "/state.db"
	go func() { done <- Run(ctx, cfg, log, "test") }()

	select {
	case err := <-done:
		t.Fatalf("Run returned before cancel: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run = %v, want nil after cancel", err)
		}
	case <-time.After(testkit.Scale(5 * time.Second)):
		t.Fatalf("Run did not return within %v of cancel", testkit.Scale(5*time.Second))
	}
	for _, want := range []string{"gateway started", "gateway stopped"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("log lacks %q:\n%s", want, out.String())
		}
	}
}

func TestRunWithoutConfig(t *testing.T) {
	if err := Run(context.Background(), nil, nil, "test"); err == nil {
		t.Fatal("Run(nil config) = nil, want an error")
	}
}

func TestRunReportsListenerInUse(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	cfg := config.Default()
	cfg.Listeners[0].Address = l.Addr().String()
	cfg.Ops.Address = ""
	cfg.Storage.Path = t.TempDir() + "/state.db"
	err = Run(context.Background(), cfg, nil, "test")
	if err == nil || !strings.Contains(err.Error(), `listener "default"`) {
		t.Fatalf("Run with a busy port = %v, want an error naming the listener", err)
	}
}
