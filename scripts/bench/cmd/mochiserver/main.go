// Command mochiserver runs mochi-mqtt's full broker as its users get it, as
// the baseline that bench-broker.sh measures fieldgate's broker against:
// mqtt.New with default options and capabilities (inline client off, $SYS
// topics every second), an allow-all auth hook and one TCP listener.
//
//	mochiserver [-addr 127.0.0.1:1883]
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
	"github.com/mochi-mqtt/server/v2/listeners"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:1883", "`host:port` of the MQTT listener")
	flag.Parse()
	if err := run(*addr); err != nil {
		fmt.Fprintln(os.Stderr, "mochiserver:", err)
		os.Exit(1)
	}
}

func run(addr string) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	srv := mqtt.New(nil)
	if err := srv.AddHook(new(auth.AllowHook), nil); err != nil {
		return fmt.Errorf("auth hook: %w", err)
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
