package bridge

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/fieldgate/fieldgate/gateway/bridge/mqttclient"
	"github.com/fieldgate/fieldgate/storage"
)

func (b *Bridge) setState(state string, err error) {
	b.shared.mu.Lock()
	defer b.shared.mu.Unlock()
	if b.shared.state != state {
		b.shared.since = time.Now()
	}
	b.shared.state = state
	if err != nil {
		b.shared.lastErr = err.Error()
	}
}

// run keeps the link up: dial, subscribe, send until the link fails, then
// wait with exponential backoff and full jitter, and again. The backoff
// grows with every dial that fails and every link that delivers nothing
// (health.go), and starts again once a link delivers.
func (b *Bridge) run(ctx context.Context) {
	// The QoS 2 packet identifiers the upstream holds in our session are
	// recorded in storage once the bridge is tracked. An untracked one
	// (a new state file, or one written before the records existed) may
	// have left identifiers in the session that nobody recorded, and the
	// server would take a new message under one as a duplicate of the
	// old: with a QoS 2 out-route its first connection starts clean (the
	// outbox still resends everything unacknowledged).
	first := true
	defer b.flushHeld()
	for ctx.Err() == nil {
		b.shared.mu.Lock()
		rt := b.rt.Load()
		relinks := b.shared.relinks
		down := b.shared.state == StateDown
		protocol := b.shared.learned.protocol
		b.shared.mu.Unlock()
		backoff := Backoff{Min: rt.cfg.ReconnectMin, Max: rt.cfg.ReconnectMax}
		opts := rt.copts
		if opts.Protocol == 0 && protocol != 0 {
			opts.Protocol = protocol // the server refused MQTT 5 before
		}
		for _, r := range rt.outs {
			if r.QoS == 2 && first && !b.loop.tracked {
				opts.CleanStart = true
			}
		}
		if !down {
			b.setState(StateConnecting, nil)
		}
		c, err := mqttclient.Dial(ctx, opts)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			b.setState(StateDown, err)
			b.noteFailed("dial", err)
			if !b.sleep(ctx, backoff.Next(b.loop.failing-1)) {
				return
			}
			continue
		}
		first = false
		if db := b.opts.Store; db != nil && !b.loop.tracked {
			var batch storage.Batch
			batch.OutboxFlightsOpen(b.name)
			if err := db.CommitWait(&batch); err != nil {
				b.log.Warn("recording QoS 2 flights failed; the next start begins a clean session", "err", err)
			} else {
				b.loop.tracked = true
			}
		}
		b.shared.mu.Lock()
		if b.shared.relinks != relinks {
			// A reload came during the dial: this link has the old
			// settings, and the reload found nothing to close.
			b.shared.mu.Unlock()
			_ = c.Close()
			b.log.Info("bridge reconfigured while connecting; connecting again")
			continue
		}
		b.shared.client = c
		b.shared.info = c.Info()
		b.shared.window = c.Window()
		b.shared.reconnects++
		learnt := b.learnLinkLocked(opts, c)
		b.shared.mu.Unlock()
		learnt.log(b)
		b.setState(StateConnected, nil)
		lk := b.newLink(c)
		b.noteConnected(lk)
		why := b.connected(ctx, lk)
		// The link has ended unless ctx is done: it is closed before the
		// in-routes are marked shut, so that no message the reader hands
		// over meanwhile is held while its acknowledgement goes upstream.
		_ = c.Close()
		b.moveRefused() // the refusals its reader heard last
		b.in.mu.Lock()
		b.in.open = false
		b.in.mu.Unlock()
		b.shared.mu.Lock()
		b.shared.client = nil
		relinked := b.shared.relinks != relinks
		b.shared.mu.Unlock()
		// Flights that waited behind a probe wait for the next link.
		b.flights.restore(lk.held)
		lk.held = nil
		err = c.Err()
		if ctx.Err() != nil {
			return
		}
		b.checkProductive(lk)
		if err == nil && !relinked {
			err = why // we closed it, for a reason of the link's
		}
		if err == nil {
			err = errors.New("connection closed")
		}
		b.setState(StateDown, err)
		switch {
		case relinked:
			// Closed for a reload: the next link has the new settings,
			// at once.
			continue
		case lk.productive:
			b.noteLost(err)
		default:
			b.noteFailed("link", err)
		}
		b.blame(lk, c.Err())
		if b.loop.failing > 0 && !b.sleep(ctx, backoff.Next(b.loop.failing-1)) {
			return
		}
	}
}

// connected runs one connection: what was in flight is resumed, the
// in-routes are subscribed, the availability marked online, and the
// outbox sent until the link ends. When the last links ended on a
// message, the link first shows it answers (a PINGRESP) and then sends
// that message alone (suspect.go). It returns why it closed the link
// itself, if it did.
func (b *Bridge) connected(ctx context.Context, lk *linkRun) error {
	c := lk.c
	probe := b.probeTarget()
	// Each step below may wait up to ack_timeout: the watchdog hears
	// between them.
	b.alive()
	if !b.resume(lk, probe) {
		return errors.New("resuming what was in flight failed")
	}
	if err := b.subscribe(ctx, c); err != nil {
		b.log.Warn("subscribing the in-routes failed", "err", err)
		return fmt.Errorf("subscribing the in-routes: %w", err)
	}
	b.alive()
	if probe != 0 {
		pctx, cancel := context.WithTimeout(ctx, b.rt.Load().cfg.AckTimeout)
		err := c.Ping(pctx)
		cancel()
		if err != nil {
			return fmt.Errorf("before probing a message the link ended on: %w", err)
		}
		lk.probe = probe
	}
	if rt := b.rt.Load(); rt.online != nil {
		// The will said offline when a link dropped; say online again,
		// through the outbox so that it comes after anything queued
		// earlier (an offline from the last shutdown, say).
		var batch storage.Batch
		bp := &batch
		if b.opts.Store == nil {
			bp = nil
		}
		b.ob.put(rt.online, rt.remote, []byte("online"), true, bp, time.Now())
		if !batch.Empty() {
			b.opts.Store.CommitLazy(&batch)
		}
	}
	b.send(ctx, lk)
	return nil
}

// subscribe opens the in-routes, giving overlapping filters their
// subscription identifiers, then hands held messages to them.
func (b *Bridge) subscribe(ctx context.Context, c *mqttclient.Client) error {
	rt := b.rt.Load()
	b.shared.mu.Lock()
	stale := b.shared.stale
	b.shared.stale = nil
	b.shared.mu.Unlock()
	if len(stale) > 0 {
		// In-routes removed by a reload: the upstream session still holds
		// their subscriptions.
		if err := c.Unsubscribe(ctx, stale); err != nil {
			b.shared.mu.Lock()
			b.shared.stale = append(b.shared.stale, stale...)
			b.shared.mu.Unlock()
			return err
		}
	}
	if len(rt.ins) == 0 {
		b.openRoutes(ctx)
		return nil
	}
	info := c.Info()
	var subs []mqttclient.Subscription
	skip := map[int]bool{}
	for i := range rt.ins {
		r := &rt.ins[i]
		if r.subID != 0 && !info.SubIDsAvailable {
			// The first of an overlapping pair is kept; the other cannot be
			// told apart on this server.
			for j := range i {
				if !skip[j] && overlap(rt.ins[j].filter, r.filter) {
					b.log.Error("in-routes overlap and the upstream offers no subscription identifiers; this route is not subscribed",
						"route", fmt.Sprintf("in[%d] %s", i, r.filter), "overlaps", fmt.Sprintf("in[%d] %s", j, rt.ins[j].filter))
					skip[i] = true
					break
				}
			}
			if skip[i] {
				continue
			}
		}
		s := mqttclient.Subscription{Filter: r.filter, QoS: byte(r.QoS), NoLocal: true}
		if info.SubIDsAvailable {
			s.ID = r.subID
		}
		subs = append(subs, s)
	}
	sctx, cancel := context.WithTimeout(ctx, rt.cfg.AckTimeout)
	defer cancel()
	reasons, err := c.Subscribe(sctx, subs)
	if err != nil {
		return err
	}
	for i, rc := range reasons {
		if rc >= 0x80 && i < len(subs) {
			b.log.Warn("upstream refused an in-route subscription", "filter", subs[i].Filter, "reason", fmt.Sprintf("0x%02X", rc))
		}
	}
	b.openRoutes(ctx)
	return nil
}

// The send loop's timings. It sleeps until an event asks for a turn (an
// entry queued, an acknowledgement, a PUBREC, the link's end); these are
// the timers armed while work waits on time instead, and the one tick of
// an idle link.
const (
	// aliveEvery is how often an idle loop tells the watchdog it is
	// alive: Options.Alive asks for once a second, and nothing else ticks
	// while there is no work.
	aliveEvery = time.Second
	// retryEvery is how soon the loop reads again for entries it was told
	// of that are not on disk yet: the publish that made them is still
	// committing (milliseconds on an SD card) or rides a lazy commit
	// (within a second). It is also the shortest wait for the pace's
	// tokens: at 500 a second, ten messages a turn rather than one a turn
	// every 2 ms.
	retryEvery = 20 * time.Millisecond
	// staleRetryEvery replaces retryEvery once an entry has been awaited
	// for gapWait: it belonged to a batch that failed, and looking for it
	// more often than the watchdog's tick would be an idle loop's cost.
	staleRetryEvery = time.Second
	// flushEvery is the longest acknowledged entries wait for their
	// delete when fewer than deleteBatch came: the delete is lazy anyway,
	// and a short wait gathers the acknowledgements of one window.
	flushEvery = 20 * time.Millisecond
)

// send hands outbox entries to the link within its window and the pace,
// until the link ends or ctx is done. While the link probes, its window is
// one message, until the probe is through.
func (b *Bridge) send(ctx context.Context, lk *linkRun) {
	c := lk.c
	pace := newPacer(b.rt.Load().cfg.Rate, max(c.Window(), 1))
	beat := time.NewTicker(aliveEvery)
	defer beat.Stop()
	soon := time.NewTimer(time.Hour) // armed only while work waits on time
	soon.Stop()
	defer soon.Stop()
	var unreadable, flushAt, armed time.Time
	b.alive()
	for {
		b.moveRefused()
		b.checkProductive(lk)
		window := c.Window()
		probing := !b.probeThrough(lk)
		if probing {
			window = 1
		}
		// A resumed session's flights: the probe's first, alone, then
		// the others once it is through.
		if len(lk.held) > 0 && (!probing || c.Inflight() == 0 && lk.held[lk.probe] != nil) && !b.resendHeld(lk) {
			_ = c.Close() // the link failed meanwhile; the next resumes them
		}
		if !probing {
			// Memory-only messages wait behind a probe: one with a topic
			// the server refuses would end the link on the probe's watch.
			for _, m := range b.ob.takeMemory() {
				_, _ = c.Publish(&mqttclient.Outgoing{Topic: m.topic, Payload: m.payload, QoS: 0, Retain: m.retain}, func(error, byte) {})
			}
		}
		now := time.Now()
		var due time.Time
		// A record failed lately: nothing QoS 2 may go without one.
		held := now.Before(b.loop.recordHold)
		if held {
			due = b.loop.recordHold
		} else {
			b.release(c)
		}
		// Entries are read from the file in runs: with a full window
		// waiting for a quarter of it to free up costs a little latency
		// and saves a read transaction per acknowledgement. A window
		// that frees up says so with the acknowledgement's wake-up.
		if free, in := window-c.Inflight(), c.Inflight(); !held && free > 0 && (in == 0 || free >= max(1, window/4)) && b.ob.pending() {
			n := pace.take(min(free, 64))
			if n == 0 {
				due = earliest(due, now.Add(max(pace.wait(), retryEvery)))
			} else {
				entries := b.ob.next(n)
				pace.giveBack(n - len(entries))
				if len(entries) > 0 || !b.ob.pending() {
					unreadable = time.Time{}
				} else {
					// Told of entries that are not on disk yet.
					if unreadable.IsZero() {
						unreadable = now
					}
					retry := retryEvery
					if now.Sub(unreadable) >= gapWait {
						retry = staleRetryEvery
					}
					due = earliest(due, now.Add(retry))
				}
				b.sendEntries(c, entries)
			}
		}
		if b.ob.hasDeletes() {
			if flushAt.IsZero() {
				flushAt = now.Add(flushEvery)
			}
			due = earliest(due, flushAt)
		} else {
			flushAt = time.Time{}
		}
		if !due.Equal(armed) {
			// Rearmed only when the time changes: a run of acknowledgements
			// waiting for one flush turns the loop without touching it.
			armed = due
			if due.IsZero() {
				soon.Stop()
			} else {
				soon.Reset(max(due.Sub(now), 0))
			}
		}
		select {
		case <-ctx.Done():
			b.ob.flushDeletes()
			return
		case <-c.Done():
			b.ob.flushDeletes()
			return
		case <-b.ob.wake:
		case <-soon.C:
			armed = time.Time{}
		case <-beat.C:
			b.alive()
		}
		if !flushAt.IsZero() && !time.Now().Before(flushAt) {
			b.ob.flushDeletes()
			flushAt = time.Time{}
		}
	}
}

// sendEntries publishes entries handed out by next, in order; what the
// link does not take goes back to the outbox.
func (b *Bridge) sendEntries(c *mqttclient.Client, entries []storage.OutboxEntry) {
	if len(entries) == 0 {
		return
	}
	pids, ready := b.prepare(c, entries)
	for i := range entries {
		if i < ready {
			if err := b.send1(c, &entries[i], pids[i], false); err == nil {
				continue
			}
		}
		// The link is going (or its window closed, or a record
		// failed): this entry and the rest go again later, under new
		// identifiers.
		b.unprepare(c, entries[i:], pids[i:])
		break
	}
	if in := c.Inflight(); in > 0 {
		b.shared.mu.Lock()
		b.shared.peak = max(b.shared.peak, in)
		b.shared.mu.Unlock()
	}
}

// earliest returns the earlier of a due time (zero: none) and t.
func earliest(due, t time.Time) time.Time {
	if due.IsZero() || t.Before(due) {
		return t
	}
	return due
}

func (b *Bridge) alive() {
	if b.opts.Alive != nil {
		b.opts.Alive()
	}
}

// sleep waits d, telling the watchdog it is alive meanwhile; false if ctx
// ended first.
func (b *Bridge) sleep(ctx context.Context, d time.Duration) bool {
	end := time.NewTimer(d)
	defer end.Stop()
	beat := time.NewTicker(aliveEvery)
	defer beat.Stop()
	for {
		b.alive()
		select {
		case <-ctx.Done():
			return false
		case <-end.C:
			return true
		case <-beat.C:
		}
	}
}

// pacer is a token bucket: rate tokens a second, up to burst.
type pacer struct {
	rate   float64
	burst  float64
	tokens float64
	last   time.Time
}

func newPacer(rate, burst int) *pacer {
	return &pacer{rate: float64(rate), burst: float64(burst), tokens: float64(burst), last: time.Now()}
}

// take returns how many of want may go now, 0 < result <= want, or 0.
func (p *pacer) take(want int) int {
	if p.rate <= 0 {
		return want
	}
	now := time.Now()
	p.tokens = min(p.burst, p.tokens+now.Sub(p.last).Seconds()*p.rate)
	p.last = now
	n := min(want, int(p.tokens))
	p.tokens -= float64(n)
	return n
}

// giveBack returns n tokens that take gave and nothing used.
func (p *pacer) giveBack(n int) {
	if p.rate > 0 && n > 0 {
		p.tokens = min(p.burst, p.tokens+float64(n))
	}
}

// wait returns how long until take can give one message.
func (p *pacer) wait() time.Duration {
	if p.rate <= 0 || p.tokens >= 1 {
		return 0
	}
	return time.Duration((1 - p.tokens) / p.rate * float64(time.Second))
}
