// Command mochiserver runs mochi-mqtt's full broker as its users get it, as
// the baseline that bench-broker.sh measures fieldgate's broker against:
// mqtt.New with default options and capabilities (inline client off, $SYS
// topics every second), an allow-all auth hook and one TCP listener.
//
//	mochiserver [-addr 127.0.0.1:1883] [-bolt FILE]
//
// -bolt adds mochi's bbolt storage hook (hooks/storage/bolt) on FILE, as
// its users persist sessions, subscriptions, retained and in-flight
// messages: bench-storage.sh measures fieldgate's storage against it. The
// hook runs with its defaults: every record it writes or deletes is a
// bbolt transaction of its own, which bbolt commits with fdatasync.
//
// It runs until SIGINT or SIGTERM.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/hooks/auth"
	"github.com/mochi-mqtt/server/v2/hooks/storage/bolt"
	"github.com/mochi-mqtt/server/v2/listeners"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:1883", "`host:port` of the MQTT listener")
	boltPath := flag.String("bolt", "", "persist through mochi's bolt storage hook in this `file` (default: no persistence)")
	flag.Parse()
	if err := run(*addr, *boltPath); err != nil {
		fmt.Fprintln(os.Stderr, "mochiserver:", err)
		os.Exit(1)
	}
}

func run(addr, boltPath string) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	srv := mqtt.New(nil)
	if err := srv.AddHook(new(auth.AllowHook), nil); err != nil {
		return fmt.Errorf("auth hook: %w", err)
	}
	if boltPath != "" {
		// Stored clients, subscriptions and messages are read back in Serve.
		if err := srv.AddHook(new(bolt.Hook), &bolt.Options{Path: boltPath}); err != nil {
			return fmt.Errorf("bolt hook on %s: %w", boltPath, err)
		}
	}
	if err := srv.AddListener(listeners.NewTCP(listeners.Config{ID: "bench", Address: addr})); err != nil {
		return fmt.Errorf("listener %s: %w", addr, err)
	}
	if err := srv.Serve(); err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	<-ctx.Done()
	return srv.Close()
}
