package brokerbench

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"
)

// heapTopics are where the brokers publish a heap figure of their own:
// fieldgate and Mosquitto (when built with memory tracking) the bytes they
// have allocated, mochi the Go heap in use. A broker publishing neither
// gets "n/a"; RSS is the figure that counts.
var heapTopics = []string{"$SYS/broker/heap/current", "$SYS/broker/system/memory"}

// errNoPID is returned by the memory scenarios when Config.PID is unset.
var errNoPID = errors.New("memory scenarios need the broker's process id (-pid)")

// heapWatch follows the broker's heap figure on a connection of its own.
type heapWatch struct {
	mu    sync.Mutex
	topic string    // the first heap topic heard; others are ignored
	value int64     // bytes
	at    time.Time // arrival of the last figure; zero: none yet
}

func watchHeap(f *fleet) (*heapWatch, error) {
	h := &heapWatch{}
	c, err := f.dial(monitor, 0)
	if err != nil {
		return nil, fmt.Errorf("heap monitor: %w", err)
	}
	if err := c.Subscribe(f.ctx, heapTopics, 0, h.update); err != nil {
		return nil, fmt.Errorf("heap monitor: %w", err)
	}
	f.serve(c, func(pk *packets.Packet) error {
		if pk.FixedHeader.Type == packets.Publish {
			h.update(pk)
		}
		return nil
	})
	return h, nil
}

func (h *heapWatch) update(pk *packets.Packet) {
	v, ok := leadingInt(pk.Payload) // Mosquitto 1.x appended " bytes"
	if !ok {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.topic == "" {
		h.topic = strings.Clone(pk.TopicName) // TopicName aliases the read buffer
	}
	if pk.TopicName == h.topic {
		h.value, h.at = v, time.Now()
	}
}

// since returns the first figure that arrives after t, waiting up to wait
// for it, and otherwise the last figure heard: Mosquitto publishes a $SYS
// value only when it changed, so silence means the last one still holds.
// ok is false when the broker published no figure at all.
func (h *heapWatch) since(ctx context.Context, t time.Time, wait time.Duration) (v int64, ok bool) {
	deadline := time.Now().Add(wait)
	for {
		h.mu.Lock()
		v, at := h.value, h.at
		h.mu.Unlock()
		if at.After(t) {
			return v, true
		}
		if !time.Now().Before(deadline) || !sleep(ctx, 20*time.Millisecond) {
			return v, !at.IsZero()
		}
	}
}

func leadingInt(b []byte) (int64, bool) {
	b = bytes.TrimSpace(b)
	n := 0
	for n < len(b) && b[n] >= '0' && b[n] <= '9' {
		n++
	}
	v, err := strconv.ParseInt(string(b[:n]), 10, 64)
	return v, err == nil
}

// footprint is the broker's memory at one moment.
type footprint struct {
	rss    int64 // bytes
	heap   int64 // bytes, when heapOK
	heapOK bool
}

// measure takes the broker's heap figure, the first published after t or
// within wait, and then reads its resident set.
func measure(ctx context.Context, cfg *Config, h *heapWatch, t time.Time, wait time.Duration) (footprint, error) {
	var m footprint
	m.heap, m.heapOK = h.since(ctx, t, wait)
	var err error
	m.rss, err = readRSS(cfg.PID)
	return m, err
}

// readRSS returns the resident set size of process pid from /proc/PID/status.
func readRSS(pid int) (int64, error) {
	path := fmt.Sprintf("/proc/%d/status", pid)
	f, err := os.Open(path)
	if err != nil {
		return 0, fmt.Errorf("broker memory: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), "VmRSS:")
		if !ok {
			continue
		}
		kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("broker memory: %s: VmRSS %q: %w", path, rest, err)
		}
		return kb << 10, nil
	}
	if err := sc.Err(); err != nil {
		return 0, fmt.Errorf("broker memory: %s: %w", path, err)
	}
	return 0, fmt.Errorf("broker memory: %s has no VmRSS line (a zombie?)", path)
}

// idleFilters are the five subscriptions of idle connection i: what a field
// device holds, with a group filter shared by a hundred devices and three
// with wildcards.
func idleFilters(i int) []string {
	id := strconv.Itoa(i)
	return []string{
		"dev/" + id + "/cmd",
		"dev/" + id + "/config/+",
		"dev/" + id + "/ota/#",
		"group/" + strconv.Itoa(i%100) + "/cmd",
		"site/+/dev/" + id + "/alarm",
	}
}

// subFilter is the k-th filter of connection c in the subscription
// scenario, distinct from every other: 10% with a single-level wildcard,
// 5% with a multi-level one.
func subFilter(c, k int) string {
	switch {
	case k%20 == 19:
		return fmt.Sprintf("fleet/%d/dev%d/#", c, k)
	case k%10 == 4:
		return fmt.Sprintf("fleet/%d/+/dev%d/temp", c, k)
	}
	return fmt.Sprintf("fleet/%d/site/dev%d/temp", c, k)
}

// memoryRun is the shape of both memory scenarios: connect conns clients,
// each subscribing to its filters, and report the broker's growth per unit.
type memoryRun struct {
	name    string
	group   string
	conns   int
	filters func(i int) []string
	units   int    // what the growth is divided by
	per     string // "conn" or "sub", for the units
}

// idleRun is the idle-connection scenario of cfg.
func idleRun(cfg *Config) memoryRun {
	return memoryRun{
		name:    fmt.Sprintf("idle-%dconns-%dsubs", cfg.Conns, len(idleFilters(0))),
		group:   "idle",
		conns:   cfg.Conns,
		filters: idleFilters,
		units:   cfg.Conns,
		per:     "conn",
	}
}

// subsRun is the subscription scenario of cfg: cfg.Subs filters spread
// evenly over cfg.SubConns connections.
func subsRun(cfg *Config) memoryRun {
	conns, subs := max(cfg.SubConns, 1), cfg.Subs
	return memoryRun{
		name:  fmt.Sprintf("subs-%dconns-%dsubs", conns, subs),
		group: "subs",
		conns: conns,
		filters: func(c int) []string {
			n := subs / conns
			if c < subs%conns {
				n++
			}
			fs := make([]string, n)
			for k := range fs {
				fs[k] = subFilter(c, k)
			}
			return fs
		},
		units: subs,
		per:   "sub",
	}
}

func (m memoryRun) run(ctx context.Context, cfg *Config) (Result, error) {
	res := Result{Broker: cfg.Broker, Scenario: m.name}
	if cfg.PID <= 0 {
		return res, errNoPID
	}
	if m.units <= 0 {
		return res, fmt.Errorf("%s: nothing to measure", m.name)
	}
	f := newFleet(ctx, cfg)
	defer f.stop()

	h, err := watchHeap(f)
	if err != nil {
		return res, err
	}
	// Any figure will do for the baseline, the retained one included: the
	// broker has served nothing yet.
	base, err := measure(ctx, cfg, h, time.Time{}, cfg.HeapWait)
	if err != nil {
		return res, err
	}
	start := time.Now()
	// No reader goroutines: after SUBACK these connections receive nothing
	// but PINGRESP, which can wait in the socket buffer.
	if _, err := f.dialMany(idler, m.conns, func(i int, c *Conn) error {
		return c.Subscribe(f.ctx, m.filters(i), 1, nil)
	}); err != nil {
		return res, err
	}
	setUp := time.Now()
	took := setUp.Sub(start)
	cfg.progress("%s: set up in %v", m.name, took.Round(time.Millisecond))
	f.keepAlive()
	if !sleep(ctx, cfg.Settle) {
		return res, ctx.Err()
	}
	// The heap figure must postdate the setup; one published while settling
	// will do. A broker that published none before will not start now.
	wait := cfg.HeapWait
	if !base.heapOK {
		wait = 0
	}
	after, err := measure(ctx, cfg, h, setUp, wait)
	if err != nil {
		return res, err
	}

	n := float64(m.units)
	const mib = 1 << 20
	res.add(float64(after.rss-base.rss)/n, "rss-B/"+m.per)
	if base.heapOK && after.heapOK {
		res.add(float64(after.heap-base.heap)/n, "heap-B/"+m.per)
	}
	res.add(float64(base.rss)/mib, "rss-base-MiB")
	res.add(float64(after.rss)/mib, "rss-MiB")
	res.add(n/took.Seconds(), m.per+"s/s")
	res.Notes = f.notes()
	return res, nil
}
