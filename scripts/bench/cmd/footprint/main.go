// Command footprint follows a running gateway for bench-footprint.sh (see
// package footprint); cmd/benchreport summarizes the run.
//
//	footprint watch -label NAME -pid PID -mqtt HOST:PORT -ops HOST:PORT [-duration 60s] [-interval 1s]
//	footprint idle -label NAME -pid PID -ops HOST:PORT [-bridged] [-settle 30s] [-duration 5m]
//
// watch prints a "sample" line per second and an "rss" line at the end on
// standard output; it exits 1 when the gateway exits, never becomes ready
// or sends no readings. idle, for bench-idle.sh, prints one "idle" line:
// the CPU time the gateway took over the duration, left alone once ready;
// it exits 1 when the gateway exits, never becomes ready, or (with
// -bridged) its bridge is not up throughout.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/fieldgate/fieldgate/scripts/bench/footprint"
)

// Exit codes.
const (
	exitFail  = 1
	exitUsage = 2
)

func main() {
	os.Exit(dispatch(os.Args[1:], os.Stdout, os.Stderr))
}

func dispatch(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		switch args[0] {
		case "watch":
			return cmdWatch(args[1:], stdout, stderr)
		case "idle":
			return cmdIdle(args[1:], stdout, stderr)
		}
	}
	fmt.Fprintln(stderr, "usage: footprint watch -label NAME -pid PID -mqtt HOST:PORT -ops HOST:PORT [flags]")
	fmt.Fprintln(stderr, "       footprint idle -label NAME -pid PID -ops HOST:PORT [flags]")
	return exitUsage
}

func cmdWatch(args []string, stdout, stderr io.Writer) int {
	cfg := footprint.WatchConfig{Prefix: "fieldgate", Duration: time.Minute, Interval: time.Second, ReadyTimeout: time.Minute}
	fs := flag.NewFlagSet("footprint watch", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&cfg.Label, "label", "", "`name` of the binary in the raw lines (required)")
	fs.IntVar(&cfg.PID, "pid", 0, "process `id` to sample: the gateway, or QEMU running it (required)")
	fs.StringVar(&cfg.MQTT, "mqtt", "", "`host:port` of the gateway's MQTT listener (required)")
	fs.StringVar(&cfg.Ops, "ops", "", "`host:port` of its ops endpoint (required)")
	fs.StringVar(&cfg.Prefix, "prefix", cfg.Prefix, "topic `prefix` of the readings")
	fs.DurationVar(&cfg.Duration, "duration", cfg.Duration, "how long to sample once the gateway is ready")
	fs.DurationVar(&cfg.Interval, "interval", cfg.Interval, "time between samples")
	fs.DurationVar(&cfg.ReadyTimeout, "ready-timeout", cfg.ReadyTimeout, "how long the gateway may take to become ready")
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	if cfg.Label == "" || cfg.PID <= 0 || cfg.MQTT == "" || cfg.Ops == "" || fs.NArg() > 0 || cfg.Interval <= 0 {
		fmt.Fprintln(stderr, "footprint watch: -label, -pid, -mqtt and -ops are required, and nothing else")
		fs.Usage()
		return exitUsage
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := footprint.Watch(ctx, cfg, stdout); err != nil {
		fmt.Fprintf(stdout, "# warn %s: %v\n", cfg.Label, err)
		return exitFail
	}
	return 0
}

func cmdIdle(args []string, stdout, stderr io.Writer) int {
	cfg := footprint.IdleConfig{Settle: 30 * time.Second, Duration: 5 * time.Minute, ReadyTimeout: time.Minute}
	fs := flag.NewFlagSet("footprint idle", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&cfg.Label, "label", "", "`name` of the configuration in the raw line (required)")
	fs.IntVar(&cfg.PID, "pid", 0, "the gateway's process `id` (required)")
	fs.StringVar(&cfg.Ops, "ops", "", "`host:port` of its ops endpoint (required)")
	fs.BoolVar(&cfg.Bridged, "bridged", false, "wait for its bridge to be up, and fail if it does not stay up")
	fs.DurationVar(&cfg.Settle, "settle", cfg.Settle, "how long to leave it alone once ready before measuring")
	fs.DurationVar(&cfg.Duration, "duration", cfg.Duration, "how long to measure")
	fs.DurationVar(&cfg.ReadyTimeout, "ready-timeout", cfg.ReadyTimeout, "how long it may take to become ready, its bridge up")
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	if cfg.Label == "" || cfg.PID <= 0 || cfg.Ops == "" || fs.NArg() > 0 || cfg.Duration <= 0 || cfg.Settle < 0 {
		fmt.Fprintln(stderr, "footprint idle: -label, -pid and -ops are required, and nothing else")
		fs.Usage()
		return exitUsage
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := footprint.Idle(ctx, cfg, stdout); err != nil {
		fmt.Fprintf(stdout, "# warn %s: %v\n", cfg.Label, err)
		return exitFail
	}
	return 0
}
