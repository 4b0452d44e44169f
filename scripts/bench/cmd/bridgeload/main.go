// Command bridgeload drives the bridge benchmark (bench-bridge.sh): a broker
// that bridges its local topics to an upstream broker, measured through an
// outage of the upstream (see the bridge scenarios of package brokerbench).
//
//	bridgeload count   -broker NAME -scenario NAME -addr UPSTREAM -client ID -n N [-events FILE] [-live HOST:PORT] [flags]
//	bridgeload publish -broker NAME -scenario NAME -addr HOST:PORT (-n N | -for DURATION) [-pubs P] [-pid PID] [flags]
//	bridgeload probe   -addr HOST:PORT
//
// count is the upstream's persistent subscriber: it runs through the whole
// scenario, appends its progress to the events file for the script to wait
// on, and ends when all N numbered messages have arrived (or nothing new
// came for -idle, or -limit passed since the upstream came back, or
// SIGTERM), printing one Go benchmark line. publish sends N numbered QoS 1
// messages to the broker under test and prints one line when the last is
// acknowledged; with -for, it publishes on the live topic for that long
// and prints the rate. probe publishes one message on the probe topic, which
// count reports when it arrives upstream. cmd/benchreport summarizes the
// lines they print.
//
// Exit status: 0 done, 1 failed, 2 bad command line, 3 no CONNACK (after
// a "# skip NAME: ..." line).
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

	"github.com/fieldgate/fieldgate/scripts/bench/brokerbench"
)

// Exit codes.
const (
	exitFail    = 1
	exitUsage   = 2
	exitSkipped = 3
)

func main() {
	os.Exit(dispatch(os.Args[1:], os.Stdout, os.Stderr))
}

func dispatch(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		switch args[0] {
		case "count":
			return cmdCount(args[1:], stdout, stderr)
		case "publish":
			return cmdPublish(args[1:], stdout, stderr)
		case "probe":
			return cmdProbe(args[1:], stderr)
		}
	}
	fmt.Fprintln(stderr, "usage: bridgeload count|publish|probe [flags]; bridgeload CMD -h for the flags")
	return exitUsage
}

// signalContext ends on SIGINT or SIGTERM, so that an interrupted count
// still prints what it saw.
func signalContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
}

func cmdCount(args []string, stdout, stderr io.Writer) int {
	cc := brokerbench.CountConfig{Keepalive: time.Minute, Progress: stderr}
	fs := flag.NewFlagSet("bridgeload count", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&cc.Broker, "broker", "", "the broker under test's `name`, for the result line (required)")
	fs.StringVar(&cc.Scenario, "scenario", "drain", "scenario `name` in the result line")
	fs.StringVar(&cc.Addr, "addr", "", "the upstream's `host:port` (required)")
	fs.StringVar(&cc.ClientID, "client", "bench-counter", "client `id` of the counting session")
	fs.IntVar(&cc.N, "n", 100000, "outage messages expected")
	fs.DurationVar(&cc.Idle, "idle", 10*time.Second, "end when no new message came for this long after the upstream came back")
	fs.DurationVar(&cc.Limit, "limit", 10*time.Minute, "end this long after the upstream came back in any case")
	fs.StringVar(&cc.Events, "events", "", "append progress events to this `file`")
	fs.StringVar(&cc.UpstreamPIDFile, "upstream-pidfile", "", "`file` holding the upstream's process id, for its CPU time over the drain")
	fs.StringVar(&cc.BrokerPIDFile, "broker-pidfile", "", "`file` holding the broker under test's process id, for its CPU time over the drain")
	fs.BoolVar(&cc.NoOutage, "no-outage", false, "count without an outage: messages fed straight to the upstream")
	live := fs.String("live", "", "the broker under test's `host:port`: publish to it while the drain runs")
	window := fs.Int("window", 8, "live publisher: QoS 1 messages awaiting PUBACK")
	payload := fs.Int("payload", 64, "live publisher: payload `bytes`")
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	if cc.Broker == "" || cc.Addr == "" || fs.NArg() > 0 {
		fmt.Fprintln(stderr, "bridgeload count: -broker and -addr are required, and nothing else")
		return exitUsage
	}
	if *live != "" {
		cfg := brokerbench.DefaultConfig()
		cfg.Broker, cfg.Addr, cfg.Window, cfg.Payload = cc.Broker, *live, *window, *payload
		cc.Live = &cfg
	}
	ctx, stop := signalContext()
	defer stop()
	res, err := brokerbench.Count(ctx, cc)
	if err != nil {
		fmt.Fprintf(stdout, "# warn %s/%s: failed: %v\n", cc.Broker, cc.Scenario, err)
		return exitFail
	}
	if err := res.Write(stdout); err != nil {
		fmt.Fprintln(stderr, "bridgeload count:", err)
		return exitFail
	}
	return 0
}

func cmdPublish(args []string, stdout, stderr io.Writer) int {
	cfg := brokerbench.DefaultConfig()
	cfg.Window = 8
	fs := flag.NewFlagSet("bridgeload publish", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&cfg.Broker, "broker", "", "broker `name` in the result line (required)")
	scenario := fs.String("scenario", "outage", "scenario `name` in the result line")
	fs.StringVar(&cfg.Addr, "addr", "", "`host:port` of the broker under test (required)")
	fs.IntVar(&cfg.PID, "pid", 0, "the broker's process `id`, for the bytes it writes to disk")
	n := fs.Int("n", 100000, "messages to publish, all publishers together")
	pubs := fs.Int("pubs", 10, "publishers")
	fs.IntVar(&cfg.Window, "window", cfg.Window, "QoS 1 messages each publisher has awaiting PUBACK")
	fs.IntVar(&cfg.Payload, "payload", cfg.Payload, "payload `bytes` (8 or more: the message number)")
	probe := fs.Duration("probe", 10*time.Second, "how long to wait for the broker's first CONNACK")
	forDur := fs.Duration("for", 0, "instead of -n numbered messages, publish on the live topic for this long")
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	if cfg.Broker == "" || cfg.Addr == "" || fs.NArg() > 0 {
		fmt.Fprintln(stderr, "bridgeload publish: -broker and -addr are required, and nothing else")
		return exitUsage
	}
	run := func(ctx context.Context) (brokerbench.Result, error) {
		if *forDur > 0 {
			return brokerbench.PublishFor(ctx, &cfg, *scenario, *pubs, *forDur)
		}
		return brokerbench.PublishN(ctx, &cfg, *scenario, *n, *pubs)
	}
	cfg.Progress = stderr
	ctx, stop := signalContext()
	defer stop()
	if err := brokerbench.Probe(ctx, cfg.Addr, *probe); err != nil {
		fmt.Fprintf(stdout, "# skip %s: %v\n", cfg.Broker, err)
		return exitSkipped
	}
	res, err := run(ctx)
	if err != nil {
		fmt.Fprintf(stdout, "# warn %s/%s: failed: %v\n", cfg.Broker, *scenario, err)
		return exitFail
	}
	if err := res.Write(stdout); err != nil {
		fmt.Fprintln(stderr, "bridgeload publish:", err)
		return exitFail
	}
	return 0
}

func cmdProbe(args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("bridgeload probe", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("addr", "", "`host:port` of the broker under test (required)")
	timeout := fs.Duration("timeout", 10*time.Second, "how long to wait for the broker and its PUBACK")
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	if *addr == "" || fs.NArg() > 0 {
		fmt.Fprintln(stderr, "bridgeload probe: -addr is required, and nothing else")
		return exitUsage
	}
	ctx, stop := signalContext()
	defer stop()
	if err := brokerbench.Probe(ctx, *addr, *timeout); err != nil {
		fmt.Fprintln(stderr, "bridgeload probe:", err)
		return exitSkipped
	}
	if err := brokerbench.PublishOne(ctx, *addr, brokerbench.BridgeProbeTopic, *timeout); err != nil {
		fmt.Fprintln(stderr, "bridgeload probe:", err)
		return exitFail
	}
	return 0
}
