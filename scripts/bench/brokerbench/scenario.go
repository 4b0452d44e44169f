package brokerbench

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"
)

// Config is what every scenario shares. DefaultConfig holds the defaults.
type Config struct {
	Broker string // the broker's name in result lines
	Addr   string // host:port of its MQTT listener
	PID    int    // its process id, for memory figures; memory scenarios need it

	Warmup          time.Duration // throughput and latency: load before measuring
	Duration        time.Duration // throughput: the measured interval
	LatencyDuration time.Duration // latency: the measured interval; 0 means Duration
	Payload         int           // bytes per message
	Window          int           // QoS 1: PUBLISHes a publisher has waiting for PUBACK
	Pairs           int           // publishers, and subscribers, of the pairwise and latency scenarios
	FanOut          int           // subscribers of the one fan-out topic
	Rate            int           // latency: messages per second, all publishers together

	Conns    int // idle connections
	Subs     int // subscriptions of the subscription scenario
	SubConns int // connections holding them

	Dials     int           // connections being set up at once
	Keepalive time.Duration // sent in CONNECT; every connection pings at half of it
	Settle    time.Duration // memory: wait after the last SUBACK before reading figures
	HeapWait  time.Duration // memory: longest wait for a fresh $SYS heap figure

	Progress io.Writer // progress lines; nil for none
}

// DefaultConfig returns the full-run settings; bench-broker.sh's QUICK mode
// shortens them.
func DefaultConfig() Config {
	return Config{
		Warmup:   time.Second,
		Duration: 5 * time.Second,
		// A sensor reading with a timestamp and a few fields as JSON.
		Payload: 64,
		// 32 outstanding PUBACKs keep a loopback link busy without letting a
		// slow broker queue without bound.
		Window: 32,
		Pairs:  10,
		FanOut: 1000,
		Rate:   1000,

		Conns:    10000,
		Subs:     100000,
		SubConns: 100,

		// A few dozen handshakes in flight keep every broker's accept
		// backlog (Mosquitto listens with 100) far from overflowing.
		Dials:     32,
		Keepalive: 60 * time.Second,
		// Long enough for a Go broker's background work after a burst of
		// connections (sweeping, scavenging) to settle.
		Settle: 2 * time.Second,
		// Every broker here publishes $SYS each second (Mosquitto only the
		// values that changed).
		HeapWait: 1500 * time.Millisecond,
	}
}

func (c *Config) progress(format string, args ...any) {
	if c.Progress != nil {
		fmt.Fprintf(c.Progress, "# %s: "+format+"\n", append([]any{c.Broker}, args...)...)
	}
}

// Scenario is one measurement the harness can run against a broker.
type Scenario struct {
	Name  string // in result lines, e.g. qos0-10x10
	Group string // throughput, latency, idle or subs
	Run   func(ctx context.Context, cfg *Config) (Result, error)
}

// Groups are the scenario groups, in the order Scenarios lists them.
var Groups = []string{"throughput", "latency", "idle", "subs"}

// Scenarios lists every scenario for cfg, in the order they run.
func Scenarios(cfg *Config) []Scenario {
	var out []Scenario
	for _, t := range []throughput{
		{qos: 0, pubs: cfg.Pairs, subs: cfg.Pairs, topics: cfg.Pairs},
		{qos: 1, pubs: cfg.Pairs, subs: cfg.Pairs, topics: cfg.Pairs},
		{qos: 0, pubs: 1, subs: cfg.FanOut, topics: 1},
		{qos: 1, pubs: 1, subs: cfg.FanOut, topics: 1},
	} {
		out = append(out, Scenario{Name: t.name(), Group: "throughput", Run: t.run})
	}
	for _, qos := range []byte{0, 1} {
		l := latency{qos: qos}
		out = append(out, Scenario{Name: l.name(cfg), Group: "latency", Run: l.run})
	}
	for _, m := range []memoryRun{idleRun(cfg), subsRun(cfg)} {
		out = append(out, Scenario{Name: m.name, Group: m.group, Run: m.run})
	}
	return out
}

// Select returns the scenarios of all whose group or name is in the comma
// separated list; "all" or "" selects every one.
func Select(all []Scenario, list string) ([]Scenario, error) {
	if list == "" || list == "all" {
		return all, nil
	}
	var out []Scenario
	for _, want := range strings.Split(list, ",") {
		want = strings.TrimSpace(want)
		found := false
		for _, s := range all {
			if s.Group != want && s.Name != want {
				continue
			}
			found = true
			if !slices.ContainsFunc(out, func(o Scenario) bool { return o.Name == s.Name }) {
				out = append(out, s)
			}
		}
		if !found {
			var names []string
			for _, s := range all {
				names = append(names, s.Name)
			}
			return nil, fmt.Errorf("brokerbench: no scenario %q; groups are %s, names %s",
				want, strings.Join(Groups, ", "), strings.Join(names, ", "))
		}
	}
	return out, nil
}
