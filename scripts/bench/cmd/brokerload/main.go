// Command brokerload measures an MQTT broker over TCP (see package
// brokerbench); cmd/benchreport summarizes the measurements of several
// brokers side by side.
//
//	brokerload run -broker NAME -addr HOST:PORT [-pid PID] [-scenarios LIST] [flags]
//
// run prints one Go benchmark line per scenario on standard output and
// progress on standard error. It exits 0 when every scenario ran, 1 when
// one failed, 2 on a bad command line, and 3 when the broker did not answer
// CONNACK in time, after printing a "# skip NAME: ..." line.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
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
		case "run":
			return cmdRun(args[1:], stdout, stderr)
		}
	}
	fmt.Fprintln(stderr, "usage: brokerload run -broker NAME -addr HOST:PORT [-pid PID] [flags]")
	return exitUsage
}

func cmdRun(args []string, stdout, stderr io.Writer) int {
	cfg := brokerbench.DefaultConfig()
	fs := flag.NewFlagSet("brokerload run", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&cfg.Broker, "broker", "", "broker `name` in result lines (required)")
	fs.StringVar(&cfg.Addr, "addr", "", "`host:port` of the broker's MQTT listener (required)")
	fs.IntVar(&cfg.PID, "pid", 0, "the broker's process `id`, for the memory scenarios")
	scenarios := fs.String("scenarios", "all", "comma-separated scenario groups ("+strings.Join(brokerbench.Groups, ", ")+
		", and "+brokerbench.PersistGroup+", which only runs when named) or names")
	fs.DurationVar(&cfg.Warmup, "warmup", cfg.Warmup, "load before measuring")
	fs.DurationVar(&cfg.Duration, "duration", cfg.Duration, "measured interval of the throughput scenarios")
	fs.DurationVar(&cfg.LatencyDuration, "latency-duration", 0, "measured interval of the latency scenarios (default -duration)")
	fs.IntVar(&cfg.Payload, "payload", cfg.Payload, "message payload `bytes`")
	fs.IntVar(&cfg.Window, "window", cfg.Window, "QoS 1 messages a publisher has waiting for PUBACK")
	fs.IntVar(&cfg.Pairs, "pairs", cfg.Pairs, "publishers and subscribers of the pairwise and latency scenarios")
	fs.IntVar(&cfg.FanOut, "fanout", cfg.FanOut, "subscribers of the fan-out scenario")
	fs.IntVar(&cfg.Rate, "rate", cfg.Rate, "latency: messages per second, all publishers together")
	fs.IntVar(&cfg.Conns, "conns", cfg.Conns, "connections of the idle scenario")
	fs.IntVar(&cfg.Subs, "subs", cfg.Subs, "subscriptions of the subscription scenario")
	fs.IntVar(&cfg.SubConns, "subconns", cfg.SubConns, "connections holding them")
	fs.IntVar(&cfg.Dials, "dials", cfg.Dials, "connections being set up at once")
	fs.DurationVar(&cfg.Keepalive, "keepalive", cfg.Keepalive, "keepalive sent in CONNECT (connections ping at half of it)")
	fs.DurationVar(&cfg.Settle, "settle", cfg.Settle, "memory: wait after connecting before reading the figures")
	probe := fs.Duration("probe", 5*time.Second, "how long to wait for the broker's first CONNACK")
	pause := fs.Duration("pause", 250*time.Millisecond, "idle time between scenarios, for the broker to drain")
	pc := brokerbench.DefaultPersistConfig()
	fs.Func("persist-pubs", "persist: comma-separated publisher `counts`, one scenario each (default 1,10,100)", func(v string) error {
		pc.Publishers = nil
		for f := range strings.SplitSeq(v, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n <= 0 {
				return fmt.Errorf("%q is not a positive count", f)
			}
			pc.Publishers = append(pc.Publishers, n)
		}
		return nil
	})
	fs.IntVar(&pc.Subscribers, "persist-subs", pc.Subscribers, "persist: offline persistent sessions every message is queued for")
	fs.IntVar(&pc.Window, "persist-window", pc.Window, "persist: QoS 1 messages a publisher has waiting for PUBACK")
	fs.StringVar(&pc.SyncLog, "sync-log", "", "persist: the broker's strace -f -ttt log of sync calls, for fsync figures")
	fs.DurationVar(&pc.Drain, "drain", pc.Drain, "persist: longest read-back of one session's queue after measuring; 0 skips it")
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	if cfg.Broker == "" || cfg.Addr == "" || fs.NArg() > 0 {
		fmt.Fprintln(stderr, "brokerload run: -broker and -addr are required, and nothing else")
		fs.Usage()
		return exitUsage
	}
	all := brokerbench.Scenarios(&cfg)
	if *scenarios != "all" && *scenarios != "" {
		all = append(all, brokerbench.PersistScenarios(pc)...)
	}
	selected, err := brokerbench.Select(all, *scenarios)
	if err != nil {
		fmt.Fprintln(stderr, "brokerload run:", err)
		return exitUsage
	}
	cfg.Progress = stderr

	need := uint64(max(cfg.Conns, cfg.FanOut, cfg.SubConns) + 64)
	if limit, err := raiseFileLimit(need); err != nil {
		fmt.Fprintf(stderr, "# %s: raising the open-file limit: %v\n", cfg.Broker, err)
	} else if limit < need {
		fmt.Fprintf(stderr, "# %s: open-file limit %d is below the %d sockets the scenarios may hold\n", cfg.Broker, limit, need)
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := brokerbench.Probe(ctx, cfg.Addr, *probe); err != nil {
		fmt.Fprintf(stdout, "# skip %s: %v\n", cfg.Broker, err)
		return exitSkipped
	}

	code := 0
	for i, s := range selected {
		if i > 0 && !sleepCtx(ctx, *pause) {
			return exitFail
		}
		fmt.Fprintf(stderr, "# %s: %s\n", cfg.Broker, s.Name)
		res, err := s.Run(ctx, &cfg)
		if err != nil {
			if errors.Is(err, context.Canceled) {
				return exitFail
			}
			fmt.Fprintf(stdout, "# warn %s/%s: failed: %v\n", cfg.Broker, s.Name, err)
			code = exitFail
			continue
		}
		if err := res.Write(stdout); err != nil {
			fmt.Fprintln(stderr, "brokerload run:", err)
			return exitFail
		}
	}
	return code
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	select {
	case <-ctx.Done():
		return false
	case <-time.After(d):
		return true
	}
}

// raiseFileLimit lifts the soft limit on open files to the hard one, and
// both to want where the process may, since the idle scenario holds a
// socket per connection. It returns the soft limit in effect.
func raiseFileLimit(want uint64) (uint64, error) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 0, err
	}
	if lim.Max < want {
		up := syscall.Rlimit{Cur: want, Max: want}
		if syscall.Setrlimit(syscall.RLIMIT_NOFILE, &up) == nil {
			return want, nil
		}
	}
	if lim.Cur < lim.Max {
		lim.Cur = lim.Max
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
			return 0, err
		}
	}
	return lim.Cur, nil
}
