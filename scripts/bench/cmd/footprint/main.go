// Command footprint follows a running gateway for bench-footprint.sh, and
// writes the summary of a run (see package footprint).
//
//	footprint watch -label NAME -pid PID -mqtt HOST:PORT -ops HOST:PORT [-duration 60s] [-interval 1s]
//	footprint summary [-o FILE] RAW
//
// watch prints a "sample" line per second and an "rss" line at the end on
// standard output; it exits 1 when the gateway exits, never becomes ready
// or sends no readings. summary prints the Markdown section, and writes it
// to FILE too with -o.
package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
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
		case "summary":
			return cmdSummary(args[1:], stdout, stderr)
		}
	}
	fmt.Fprintln(stderr, "usage: footprint watch -label NAME -pid PID -mqtt HOST:PORT -ops HOST:PORT [flags]")
	fmt.Fprintln(stderr, "       footprint summary [-o FILE] RAW")
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

func cmdSummary(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("footprint summary", flag.ContinueOnError)
	fs.SetOutput(stderr)
	out := fs.String("o", "", "also write the summary to this `file`")
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	if fs.NArg() != 1 {
		fmt.Fprintln(stderr, "usage: footprint summary [-o FILE] RAW")
		return exitUsage
	}
	name := fs.Arg(0)
	f, err := os.Open(name)
	if err != nil {
		fmt.Fprintln(stderr, "footprint summary:", err)
		return exitFail
	}
	defer f.Close()
	raw, err := footprint.Parse(f)
	if err != nil {
		fmt.Fprintf(stderr, "footprint summary: %s: %v\n", name, err)
		return exitFail
	}
	var buf bytes.Buffer
	if err := footprint.Summarize(&buf, raw, "scripts/bench/results/"+filepath.Base(name)); err != nil {
		fmt.Fprintln(stderr, "footprint summary:", err)
		return exitFail
	}
	if *out != "" {
		if err := os.WriteFile(*out, buf.Bytes(), 0o644); err != nil {
			fmt.Fprintln(stderr, "footprint summary:", err)
			return exitFail
		}
	}
	_, _ = stdout.Write(buf.Bytes())
	return 0
}
