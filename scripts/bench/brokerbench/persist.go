package brokerbench

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"
)

// The persistence scenarios, persist-qos1-PxS: P publishers send QoS 1
// messages as fast as the broker acknowledges them, publisher i on bench/i,
// while S persistent sessions (clean session 0) subscribed at QoS 1 to
// every one of those topics are disconnected. Each message is therefore
// queued S times for sessions that are away, which a persisting broker
// writes to its store. The figure is PUBACKs per second over Duration after
// Warmup, with what it cost the disk:
//
//   - fsyncs/s and fsyncs/msg: sync calls (syncCalls) the broker started
//     in the interval, counted from the strace log PersistConfig.SyncLog.
//     Tracing slows a broker at every sync call, so a run with a log is
//     a scenario of its own, persist-qos1-PxS-traced, and its PUBACKs per
//     second are not the broker's own;
//   - disk-B/msg and disk-KiB/s: the growth of write_bytes in
//     /proc/PID/io, the bytes the kernel has to write to the device for
//     the broker, per PUBACK;
//   - stored-%: after measuring, the publishers stop and wait for their
//     last PUBACKs, and one of the sessions reconnects and reads its queue
//     back; the messages it receives per message acknowledged in the whole
//     run. Below 100 the broker acknowledged messages it did not keep.
//   - replay-msgs/s: how fast that queue came back, over at most
//     PersistConfig.Drain: a broker may take minutes to send a large one.

// tracedSuffix ends the name of a persistence scenario run under strace.
const tracedSuffix = "-traced"

// PersistGroup is the group of the persistence scenarios. They run only
// when named, since they leave queued sessions in the broker.
const PersistGroup = "persist"

// sessionSettle is the pause between the persistent subscribers'
// DISCONNECT and the first PUBLISH: a broker processes the DISCONNECT
// within microseconds, but a message routed before it would go to an
// online session and never touch the store.
const sessionSettle = 250 * time.Millisecond

// ackWait bounds the wait for the PUBACKs outstanding when the publishers
// stop: a broker that fsyncs every record clears a window of hundreds of
// messages in a few seconds.
const ackWait = 30 * time.Second

// syncLogLag is how long a sync call started in the interval may still
// take to return and be logged once the broker has acknowledged
// everything: an fsync on a loaded SD card, at worst.
const syncLogLag = 200 * time.Millisecond

// drainIdle ends the read-back of a queue: a broker sending a queue pauses
// far less than this between two messages.
const drainIdle = time.Second

// syncCalls are the system calls that make written data durable.
// bench-storage.sh has strace log these (fsync and fdatasync are what the
// brokers here use); countSyncs counts them.
var syncCalls = []string{"fsync", "fdatasync", "sync_file_range", "syncfs"}

// ErrSessionLost is returned when a persistent session the scenario
// created is gone when it reconnects.
var ErrSessionLost = errors.New("brokerbench: the broker lost a persistent session")

// PersistConfig configures the persistence scenarios beyond Config.
// DefaultPersistConfig holds the defaults.
type PersistConfig struct {
	Publishers  []int         // publisher counts, one scenario each
	Subscribers int           // persistent sessions, offline, every message is queued for
	Window      int           // PUBLISHes a publisher has waiting for PUBACK
	SyncLog     string        // strace -f -ttt log of the broker's sync calls; "" for no fsync figures
	Drain       time.Duration // longest read-back of one session's queue; 0 skips it
}

// DefaultPersistConfig returns the full-run settings of bench-storage.sh.
func DefaultPersistConfig() PersistConfig {
	return PersistConfig{
		Publishers: []int{1, 10, 100},
		// A dashboard, a historian and a cloud bridge that are away.
		Subscribers: 3,
		// A device has few messages in flight; eight per connection keep a
		// commit's worth in flight without letting one client hog it.
		Window: 8,
		Drain:  30 * time.Second,
	}
}

// PersistScenarios lists the persistence scenarios of pc, one per
// publisher count.
func PersistScenarios(pc PersistConfig) []Scenario {
	var out []Scenario
	for _, n := range pc.Publishers {
		p := persist{pubs: n, pc: pc}
		out = append(out, Scenario{Name: p.name(), Group: PersistGroup, Run: p.run})
	}
	return out
}

// persist is one persistence scenario: pubs publishers, and pc.Subscribers
// offline sessions subscribed to every publisher's topic.
type persist struct {
	pubs int
	pc   PersistConfig
}

func (p persist) name() string {
	name := fmt.Sprintf("persist-qos1-%dx%d", p.pubs, p.pc.Subscribers)
	if p.pc.SyncLog != "" {
		name += tracedSuffix
	}
	return name
}

func (p persist) run(ctx context.Context, cfg *Config) (Result, error) {
	res := Result{Broker: cfg.Broker, Scenario: p.name()}
	if p.pubs <= 0 || p.pc.Subscribers <= 0 {
		return res, fmt.Errorf("%s: needs publishers and subscribers", p.name())
	}
	c := *cfg
	c.Window = p.pc.Window
	f := newFleet(ctx, &c)
	defer f.stop()

	topics := make([]string, p.pubs)
	for i := range topics {
		topics[i] = benchTopic(i)
	}
	sessions := make([]string, p.pc.Subscribers)
	for i := range sessions {
		sessions[i] = fmt.Sprintf("%sq%d", f.prefix, i)
		if err := leaveSession(ctx, &c, sessions[i], topics); err != nil {
			return res, fmt.Errorf("persistent subscriber %d: %w", i+1, err)
		}
	}
	if !sleep(ctx, sessionSettle) {
		return res, ctx.Err()
	}

	sent := make([]counter, p.pubs)
	outboxes := make([]atomic.Pointer[outbox], p.pubs)
	var quiet atomic.Bool
	if err := f.publishers(p.pubs, benchTopic, 1, c.Payload, func(i int, o *outbox) {
		outboxes[i].Store(o)
		f.flood(o, &sent[i], &quiet)
	}); err != nil {
		return res, err
	}
	f.keepAlive()
	// PUBLISHes written less those still in a window: exact but for a
	// message being written at the moment of reading, one per publisher.
	acked := func() int64 {
		n := total(sent)
		for i := range outboxes {
			if o := outboxes[i].Load(); o != nil {
				n -= int64(len(o.window))
			}
		}
		return n
	}

	if !sleep(ctx, c.Warmup) {
		return res, ctx.Err()
	}
	disk0, diskErr := diskWrites(c.PID)
	a0, t0 := acked(), time.Now()
	if !sleep(ctx, c.Duration) {
		return res, ctx.Err()
	}
	a1, t1 := acked(), time.Now()
	disk1, err := diskWrites(c.PID)
	diskErr = cmp.Or(diskErr, err)

	msgs, secs := float64(a1-a0), t1.Sub(t0).Seconds()
	res.add(msgs/secs, "acks/s")
	if msgs == 0 {
		res.Notes = append(res.Notes, "no PUBACK while measuring")
	}

	// The read-back compares with every message acknowledged, so the
	// outstanding PUBACKs must come in first. Meanwhile, or after
	// syncLogLag, the sync calls of the interval reach the log: strace
	// writes a line when a call returns.
	quiet.Store(true)
	if p.pc.Drain > 0 && !awaitAcks(ctx, outboxes, ackWait) {
		res.Notes = append(res.Notes, fmt.Sprintf("PUBACKs still outstanding %v after the publishers stopped", ackWait))
	}
	if p.pc.SyncLog != "" && !sleep(ctx, syncLogLag) {
		return res, ctx.Err()
	}
	if p.pc.SyncLog != "" {
		n, err := countSyncFile(p.pc.SyncLog, t0, t1)
		switch {
		case err != nil:
			res.Notes = append(res.Notes, "no fsync figures: "+err.Error())
		case msgs > 0:
			res.add(float64(n)/secs, "fsyncs/s")
			res.add(float64(n)/msgs, "fsyncs/msg")
		}
	}
	switch {
	case diskErr != nil:
		res.Notes = append(res.Notes, "no disk figures: "+diskErr.Error())
	case msgs > 0:
		res.add(float64(disk1-disk0)/msgs, "disk-B/msg")
		res.add(float64(disk1-disk0)/1024/secs, "disk-KiB/s")
	}

	if p.pc.Drain > 0 {
		all := total(sent)
		got, done, took, err := drain(ctx, &c, sessions[0], p.pc.Drain)
		switch {
		case err != nil:
			res.Notes = append(res.Notes, fmt.Sprintf("reading back the queue of %s: %v", sessions[0], err))
		case !done:
			res.Notes = append(res.Notes, fmt.Sprintf("queue read back only in part: %d of %d messages in %v", got, all, p.pc.Drain))
		case all > 0:
			res.add(100*float64(got)/float64(all), "stored-%")
		}
		if err == nil && got > 0 && took > 0 {
			res.add(float64(got)/took.Seconds(), "replay-msgs/s")
		}
	}
	res.Notes = append(res.Notes, f.notes()...)
	return res, nil
}

// awaitAcks waits until no outbox has a PUBLISH awaiting PUBACK, at most
// limit, and reports whether none has.
func awaitAcks(ctx context.Context, outboxes []atomic.Pointer[outbox], limit time.Duration) bool {
	deadline := time.Now().Add(limit)
	for {
		pending := false
		for i := range outboxes {
			if o := outboxes[i].Load(); o != nil && len(o.window) > 0 {
				pending = true
			}
		}
		if !pending {
			return true
		}
		if time.Now().After(deadline) || !sleep(ctx, 10*time.Millisecond) {
			return false
		}
	}
}

// dialSession connects as clientID with a persistent session (clean
// session 0) and reports whether the broker had one for it already.
func dialSession(ctx context.Context, cfg *Config, clientID string) (*Conn, bool, error) {
	c, err := Dial(ctx, cfg.Addr, Options{
		ClientID:   clientID,
		Keepalive:  cfg.Keepalive,
		ReadBuffer: subscriber.buf,
		Persistent: true,
	})
	if err != nil {
		return nil, false, err
	}
	return c, c.SessionPresent(), nil
}

// leaveSession creates the persistent session clientID subscribed to
// topics at QoS 1 and disconnects it, leaving it offline.
func leaveSession(ctx context.Context, cfg *Config, clientID string, topics []string) error {
	c, _, err := dialSession(ctx, cfg, clientID)
	if err != nil {
		return err
	}
	if err := c.Subscribe(ctx, topics, 1, nil); err != nil {
		c.Close()
		return err
	}
	return c.Close()
}

// drain reconnects the session clientID and reads back the messages queued
// for it, acknowledging each, until none has come for drainIdle or limit
// has passed. It returns how many came, whether the queue ran dry, and how
// long they took from CONNECT to the last one.
func drain(ctx context.Context, cfg *Config, clientID string, limit time.Duration) (n int64, done bool, took time.Duration, err error) {
	start := time.Now()
	c, present, err := dialSession(ctx, cfg, clientID)
	if err != nil {
		return 0, false, 0, err
	}
	defer c.Close()
	if !present {
		return 0, false, 0, fmt.Errorf("%w: no session present for %s", ErrSessionLost, clientID)
	}
	deadline := start.Add(limit)
	var pk packets.Packet
	for ctx.Err() == nil {
		idle, until := time.Now().Add(drainIdle), deadline
		if idle.Before(until) {
			until = idle
		}
		_ = c.nc.SetReadDeadline(until)
		if err := c.Read(&pk); err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				return n, until.Equal(idle), took, nil
			}
			return n, false, took, err
		}
		if pk.FixedHeader.Type != packets.Publish {
			continue
		}
		n++
		took = time.Since(start)
		if pk.FixedHeader.Qos > 0 {
			if err := c.puback(pk.PacketID, !c.buffered()); err != nil {
				return n, false, took, err
			}
		}
	}
	return n, false, took, ctx.Err()
}

// diskWrites returns write_bytes of /proc/PID/io: the bytes process pid
// has caused to be written to a storage device, counted when a page in
// the page cache turns dirty, so a page rewritten after an fsync counts
// again.
func diskWrites(pid int) (int64, error) {
	if pid <= 0 {
		return 0, errNoPID
	}
	path := fmt.Sprintf("/proc/%d/io", pid)
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "write_bytes:"); ok {
			return strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		}
	}
	return 0, fmt.Errorf("%s has no write_bytes line", path)
}

// countSyncFile is countSyncs on the file at path.
func countSyncFile(path string, from, to time.Time) (int, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	return countSyncs(f, from, to)
}

// countSyncs counts the sync calls an strace log written with -ttt (and
// -f, which puts the thread id first) shows starting at or after from and
// before to. A call that another thread's line interrupted is logged
// twice, "fsync(3 <unfinished ...>" and "<... fsync resumed>", and counted
// once, at its start.
func countSyncs(r io.Reader, from, to time.Time) (int, error) {
	n := 0
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 0 && !strings.Contains(fields[0], ".") {
			fields = fields[1:] // the thread id
		}
		if len(fields) < 2 {
			continue
		}
		call, _, ok := strings.Cut(fields[1], "(")
		if !ok || !slices.Contains(syncCalls, call) {
			continue
		}
		at, err := parseStraceTime(fields[0])
		if err != nil {
			return n, err
		}
		if !at.Before(from) && at.Before(to) {
			n++
		}
	}
	return n, sc.Err()
}

// parseStraceTime parses strace -ttt's seconds since the epoch with
// microseconds, "1795981582.053570".
func parseStraceTime(s string) (time.Time, error) {
	secs, frac, _ := strings.Cut(s, ".")
	sec, err := strconv.ParseInt(secs, 10, 64)
	if err != nil {
		return time.Time{}, fmt.Errorf("strace timestamp %q: %w", s, err)
	}
	var nsec int64
	if frac != "" {
		frac = (frac + "000000000")[:9]
		if nsec, err = strconv.ParseInt(frac, 10, 64); err != nil {
			return time.Time{}, fmt.Errorf("strace timestamp %q: %w", s, err)
		}
	}
	return time.Unix(sec, nsec), nil
}
