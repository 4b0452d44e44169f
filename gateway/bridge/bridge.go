package bridge

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fieldgate/fieldgate/gateway/bridge/mqttclient"
	"github.com/fieldgate/fieldgate/gateway/config"
	"github.com/fieldgate/fieldgate/matcher"
	"github.com/fieldgate/fieldgate/storage"
)

// Local is the in-process broker client a bridge publishes inbound
// messages through; the broker's *Client satisfies it.
type Local interface {
	Publish(ctx context.Context, topic string, payload []byte, qos byte, retain bool) error
}

// Options is what a bridge needs beyond its configuration.
type Options struct {
	Device string       // the gateway's name, for {device}
	Store  *storage.DB  // the outbox's home; nil keeps everything in memory (tests)
	Log    *slog.Logger // nil discards
	// Availability is the gateway's local availability topic; when an
	// out-route carries it, the upstream connection's will marks the
	// gateway offline there, and each connection marks it online.
	Availability string
	// Alive, when set, is called at least once a second while the bridge's
	// loops go round, connected or not: a watchdog that stops hearing it
	// knows the bridge is stuck.
	Alive func()
}

// maxHeld bounds the inbound messages no open subscription claims yet (a
// resumed session's backlog arriving before the routes are subscribed).
const maxHeld = 1024

// Bridge carries messages between the local broker and one upstream
// broker: out-routes through a durable outbox, in-routes back to local
// subscribers.
type Bridge struct {
	name string
	opts Options
	log  *slog.Logger
	ob   *outbox
	rt   atomic.Pointer[routing] // replaced whole by Reconfigure

	local  Local
	cancel context.CancelFunc
	wg     sync.WaitGroup

	// inMu orders inbound delivery: the reader's messages and the
	// backlog handed over when the in-routes open go one at a time, so
	// none is held after the hand-over and none overtakes the backlog.
	inMu sync.Mutex

	mu         sync.Mutex
	state      string
	lastErr    string
	since      time.Time
	info       mqttclient.Info
	open       bool // the in-routes are subscribed
	held       []*mqttclient.Incoming
	reconnects uint64
	sent       uint64
	acked      uint64
	inbound    uint64
	heldDrops  uint64
	window     int
	peak       int // the most QoS 1/2 messages seen in flight at once

	// flights are the outbox entries handed to the current or last link,
	// by sequence, with their packet identifiers: after a reconnect with
	// the session present they are resent with those identifiers
	// [MQTT-4.4.0-1], so that the server's QoS 2 state still matches.
	// QoS 2 flights are also recorded in storage, before each PUBLISH and
	// each PUBREL, so that this holds across a restart too.
	flights map[uint64]*outFlight
	byPID   map[uint16]*outFlight // the same, by packet identifier
	recs    []uint16              // PUBRECs whose PUBREL waits for its record
	stamp   uint64                // the next flight record's stamp
	tracked bool                  // storage records this bridge's QoS 2 flights
	// A failed QoS 2 record (a full or failing disk) holds the sender
	// back until recordHold, and is logged at most once per recordWarnEvery;
	// both belong to the run goroutine.
	recordHold, recordWarned time.Time
	received                 mqttclient.Received // inbound QoS 2 identifiers, across reconnects
	resumed                  uint64              // messages resent under their identifiers after a reconnect
	client                   *mqttclient.Client  // the current link, nil while down
	stale                    []string            // in-route filters to unsubscribe on the next link
	// relinks counts the reloads that replace the link: one that lands
	// while run dials finds no client to close, and run, seeing the
	// count moved, closes the link it dialled with the old settings.
	relinks uint64
}

// routing is a bridge's configuration as compiled: swapped whole, so that
// a reload never shows a half-changed set of routes.
type routing struct {
	cfg    config.Bridge
	outs   []outRoute
	ins    []inRoute
	copts  mqttclient.Options
	online *outRoute // the out-route that carries the availability topic
	remote string    // its remote topic
}

// outFlight is one outbox entry in flight upstream.
type outFlight struct {
	seq      uint64
	pid      uint16
	recorded bool // QoS 2: its record (pid, not released) is in storage
	recd     bool // QoS 2: PUBREC came; PUBREL waits until released is recorded
	released bool // QoS 2: PUBREC came and is recorded; PUBREL is what to resend
}

// Link states, as reported in Stats.
const (
	StateConnecting = "connecting"
	StateConnected  = "connected"
	StateDown       = "down"
	StateStopped    = "stopped"
)

// New prepares a bridge: it compiles the routes and reads the outbox's
// counters from storage; it connects nothing until Start.
func New(cfg config.Bridge, opts Options) (*Bridge, error) {
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	outs, ins, err := compileRoutes(cfg, opts.Device)
	if err != nil {
		return nil, err
	}
	if cfg.Protocol == "3.1.1" {
		if a, b := overlapping(ins); a != nil {
			return nil, fmt.Errorf("bridge %s: in[%d] (%s) and in[%d] (%s) overlap, and MQTT 3.1.1 has no subscription identifiers to tell their messages apart; make the filters disjoint or use protocol 5",
				cfg.Name, a.index, a.filter, b.index, b.filter)
		}
	}
	ob, err := newOutbox(opts.Store, cfg.Name, int64(cfg.MaxOutboxBytes), cfg.MaxOutboxAge, outs)
	if err != nil {
		return nil, fmt.Errorf("bridge %s: outbox: %w", cfg.Name, err)
	}
	b := &Bridge{name: cfg.Name, opts: opts, log: opts.Log.With("bridge", cfg.Name), ob: ob, state: StateStopped,
		flights: map[uint64]*outFlight{}, byPID: map[uint16]*outFlight{}, stamp: 1}
	rt, err := b.compile(cfg, outs, ins)
	if err != nil {
		return nil, err
	}
	b.rt.Store(rt)
	if n := ob.count; n > 0 {
		b.log.Info("outbox holds messages from before", "messages", n, "bytes", ob.bytes)
	}
	if err := b.loadFlights(); err != nil {
		return nil, fmt.Errorf("bridge %s: %w", cfg.Name, err)
	}
	return b, nil
}

// loadFlights takes up the QoS 2 messages that were in flight upstream
// when the gateway last stopped, to resume them on the first connection.
// Of two records holding one packet identifier, the older one's message
// completed before the identifier was taken again: its entry is done.
func (b *Bridge) loadFlights() error {
	db := b.opts.Store
	if db == nil {
		return nil
	}
	set, err := db.OutboxFlights(b.name)
	if err != nil {
		return err
	}
	b.tracked = set.Tracked
	if set.Bad > 0 {
		b.log.Warn("QoS 2 flight records do not decode; their messages go again as new", "records", set.Bad)
	}
	live := map[uint16]storage.OutboxFlight{}
	var done []storage.OutboxFlight
	for _, f := range set.Flights {
		b.stamp = max(b.stamp, f.Stamp+1)
		if old, ok := live[f.PID]; ok {
			if old.Stamp > f.Stamp {
				old, f = f, old
			}
			done = append(done, old)
		}
		live[f.PID] = f
	}
	var batch storage.Batch
	for _, f := range done {
		if size, topic, ok := b.entry(f.Seq); ok {
			b.ob.resumeFlight(f.Seq, size)
			b.ob.acked(f.Seq, topic, "")
		} else {
			batch.OutboxFlightDelete(b.name, f.Seq)
		}
	}
	for _, f := range live {
		size, _, ok := b.entry(f.Seq)
		if !ok {
			batch.OutboxFlightDelete(b.name, f.Seq) // its entry's delete came first
			continue
		}
		b.ob.resumeFlight(f.Seq, size)
		of := &outFlight{seq: f.Seq, pid: f.PID, recorded: true, released: f.Released}
		b.flights[f.Seq] = of
		b.byPID[f.PID] = of
	}
	db.CommitLazy(&batch)
	b.ob.flushDeletes()
	if n := len(b.flights); n > 0 {
		b.log.Info("QoS 2 messages in flight upstream at the last stop are resumed", "messages", n)
	}
	return nil
}

// entry reads outbox entry seq's size and topic.
func (b *Bridge) entry(seq uint64) (size int, topic string, ok bool) {
	e := b.ob.entry(seq)
	if e == nil {
		return 0, "", false
	}
	return e.Size(), e.Msg.Topic, true
}

// compile builds the routing of cfg: the client's options, with the will
// when an out-route carries the availability topic.
func (b *Bridge) compile(cfg config.Bridge, outs []outRoute, ins []inRoute) (*routing, error) {
	copts, err := clientOptions(cfg, b.opts.Device)
	if err != nil {
		return nil, err
	}
	rt := &routing{cfg: cfg, outs: outs, ins: ins, copts: copts}
	rt.copts.OnMessage = b.onMessage
	rt.copts.Received = &b.received
	if b.opts.Store != nil {
		rt.copts.OnPubrec = b.onPubrec
	}
	if a := b.opts.Availability; a != "" {
		for i := range outs {
			if matcher.Matches(outs[i].filter, a) {
				if remote, ok := outs[i].topic.render(a); ok {
					rt.online, rt.remote = &outs[i], remote
					rt.copts.Will = &mqttclient.Will{Topic: remote, Payload: []byte("offline"), QoS: 1, Retain: true}
				}
				break
			}
		}
	}
	return rt, nil
}

// Reconfigure applies a changed configuration of the same bridge (a
// reload): routes and budgets take effect at once; when the link's own
// settings or the in-routes changed, the link is replaced, and in-route
// filters no longer configured are unsubscribed upstream. The outbox and
// what it holds are kept; queued entries keep the class of the route
// index they were queued under.
func (b *Bridge) Reconfigure(cfg config.Bridge) error {
	outs, ins, err := compileRoutes(cfg, b.opts.Device)
	if err != nil {
		return err
	}
	if cfg.Protocol == "3.1.1" {
		if x, y := overlapping(ins); x != nil {
			return fmt.Errorf("bridge %s: in[%d] (%s) and in[%d] (%s) overlap, and MQTT 3.1.1 has no subscription identifiers to tell their messages apart", cfg.Name, x.index, x.filter, y.index, y.filter)
		}
	}
	rt, err := b.compile(cfg, outs, ins)
	if err != nil {
		return err
	}
	old := b.rt.Load()
	b.ob.configure(int64(cfg.MaxOutboxBytes), cfg.MaxOutboxAge, outs)
	relink := !sameLink(old.cfg, cfg)
	var stale []string
	for _, o := range old.ins {
		found := false
		for _, n := range ins {
			found = found || n.filter == o.filter
		}
		if !found {
			stale = append(stale, o.filter)
		}
	}
	replace := relink || len(stale) > 0 || len(old.ins) != len(ins)
	b.mu.Lock()
	b.rt.Store(rt)
	var c *mqttclient.Client
	if replace {
		b.relinks++
		b.stale = append(b.stale, stale...)
		c = b.client
	}
	b.mu.Unlock()
	if c != nil {
		b.log.Info("bridge reconfigured; replacing the link")
		_ = c.Close()
	}
	return nil
}

// sameLink reports whether two configurations connect the same way and
// subscribe the same in-routes.
func sameLink(a, b config.Bridge) bool {
	a.Out, b.Out = nil, nil
	a.MaxOutboxBytes, b.MaxOutboxBytes = 0, 0
	a.MaxOutboxAge, b.MaxOutboxAge = 0, 0
	a.Rate, b.Rate = 0, 0
	return reflect.DeepEqual(a, b)
}

// Name returns the bridge's configured name.
func (b *Bridge) Name() string { return b.name }

// LocalID is the in-process client id the bridge must publish inbound
// messages as: what that client publishes is never offered back out.
func (b *Bridge) LocalID() string { return "fieldgate-bridge-" + b.name }

// clientOptions turns the configuration into the upstream client's options.
func clientOptions(c config.Bridge, device string) (mqttclient.Options, error) {
	o := mqttclient.Options{
		Address: c.Address, ClientID: c.ClientID, Username: c.Username,
		KeepAlive: c.KeepAlive, SessionExpiry: c.SessionExpiry, ConnectTimeout: c.AckTimeout,
		AckTimeout: c.AckTimeout, MaxInflight: c.MaxInflight,
	}
	if o.ClientID == "" {
		o.ClientID = "fieldgate-" + device + "-" + c.Name
	}
	switch c.Protocol {
	case "5":
		o.Protocol = 5
	case "3.1.1":
		o.Protocol = 4
	}
	o.Password = []byte(c.Password)
	if c.PasswordFile != "" {
		data, err := os.ReadFile(c.PasswordFile)
		if err != nil {
			return o, fmt.Errorf("bridge %s: password_file: %w", c.Name, err)
		}
		line, _, _ := strings.Cut(string(data), "\n")
		o.Password = []byte(strings.TrimRight(line, "\r"))
	}
	if c.TLS.Enabled {
		host, _, err := net.SplitHostPort(c.Address)
		if err != nil {
			return o, fmt.Errorf("bridge %s: address: %w", c.Name, err)
		}
		tc := &tls.Config{ServerName: host, MinVersion: tls.VersionTLS12}
		if c.TLS.ServerName != "" {
			tc.ServerName = c.TLS.ServerName
		}
		if c.TLS.CAFile != "" {
			pem, err := os.ReadFile(c.TLS.CAFile)
			if err != nil {
				return o, fmt.Errorf("bridge %s: tls.ca_file: %w", c.Name, err)
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				return o, fmt.Errorf("bridge %s: tls.ca_file %s holds no PEM certificate", c.Name, c.TLS.CAFile)
			}
			tc.RootCAs = pool
		}
		if c.TLS.Cert != "" {
			cert, err := tls.LoadX509KeyPair(c.TLS.Cert, c.TLS.Key)
			if err != nil {
				return o, fmt.Errorf("bridge %s: tls.cert and tls.key: %w", c.Name, err)
			}
			tc.Certificates = []tls.Certificate{cert}
		}
		o.TLS = tc
	}
	return o, nil
}

// Offer queues a routed local message on every out-route it matches,
// into batch, before the publisher is acknowledged. It returns false when
// an alarm route refused it because the outbox is full. What the bridge's
// own client published (messages that came in) is never sent back out.
func (b *Bridge) Offer(topic string, payload []byte, retain bool, from string, batch *storage.Batch) bool {
	if from == b.LocalID() {
		return true
	}
	ok := true
	var now time.Time
	rt := b.rt.Load()
	for i := range rt.outs {
		r := &rt.outs[i]
		if !matcher.Matches(r.filter, topic) {
			continue
		}
		remote, valid := r.topic.render(topic)
		if !valid {
			b.log.Warn("out-route makes no valid topic; not sent", "route", r.index, "topic", topic, "template", r.Topic)
			continue
		}
		if now.IsZero() {
			now = time.Now()
		}
		if !b.ob.put(r, remote, payload, retain || r.Retain, batch, now) {
			ok = false
		}
	}
	return ok
}

// Start connects to the upstream and keeps connected until Stop; local
// publishes inbound messages.
func (b *Bridge) Start(ctx context.Context, local Local) {
	ctx, b.cancel = context.WithCancel(ctx)
	b.local = local
	b.wg.Add(2)
	go func() {
		defer b.wg.Done()
		b.run(ctx)
	}()
	go func() {
		defer b.wg.Done()
		b.expireLoop(ctx)
	}()
}

// Stop closes the upstream connection and waits for the bridge's
// goroutines. What is queued stays in the outbox for the next start.
func (b *Bridge) Stop() {
	if b.cancel == nil {
		return
	}
	b.cancel()
	b.wg.Wait()
	b.setState(StateStopped, nil)
}

// Drain waits up to d (and within ctx) for the outbox to be sent and
// acknowledged while the link is up; at shutdown it lets the last
// messages, such as the gateway's offline mark, go before the link closes.
func (b *Bridge) Drain(ctx context.Context, d time.Duration) {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		b.mu.Lock()
		up := b.state == StateConnected
		b.mu.Unlock()
		b.ob.mu.Lock()
		empty := b.ob.count == 0 && len(b.ob.memory) == 0
		b.ob.mu.Unlock()
		if !up || empty {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (b *Bridge) expireLoop(ctx context.Context) {
	t := time.NewTicker(time.Minute)
	defer t.Stop()
	for {
		b.ob.expire(time.Now())
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (b *Bridge) setState(state string, err error) {
	b.mu.Lock()
	changed := b.state != state
	b.state = state
	if changed {
		b.since = time.Now()
	}
	if err != nil {
		b.lastErr = err.Error()
	}
	b.mu.Unlock()
	if !changed {
		return
	}
	switch {
	case state == StateConnected:
		b.log.Info("upstream connected", "address", b.rt.Load().cfg.Address)
	case err != nil && state == StateDown:
		b.log.Warn("upstream link down", "address", b.rt.Load().cfg.Address, "err", err)
	}
}

// run keeps the link up: dial, subscribe, send until the link fails, then
// wait with exponential backoff and full jitter, and again.
func (b *Bridge) run(ctx context.Context) {
	attempt := 0
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
		b.mu.Lock()
		rt := b.rt.Load()
		relinks := b.relinks
		down := b.state == StateDown
		b.mu.Unlock()
		backoff := Backoff{Min: rt.cfg.ReconnectMin, Max: rt.cfg.ReconnectMax}
		opts := rt.copts
		for _, r := range rt.outs {
			if r.QoS == 2 && first && !b.tracked {
				opts.CleanStart = true
			}
		}
		if !down {
			// While down, retries keep the state (and the log) quiet:
			// one line when the link goes, one when it is back.
			b.setState(StateConnecting, nil)
		}
		c, err := mqttclient.Dial(ctx, opts)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			b.setState(StateDown, err)
			wait := backoff.Next(attempt)
			attempt++
			if !b.sleep(ctx, wait) {
				return
			}
			continue
		}
		attempt = 0
		first = false
		if db := b.opts.Store; db != nil && !b.tracked {
			var batch storage.Batch
			batch.OutboxFlightsOpen(b.name)
			if err := db.CommitWait(&batch); err != nil {
				b.log.Warn("recording QoS 2 flights failed; the next start begins a clean session", "err", err)
			} else {
				b.tracked = true
			}
		}
		b.mu.Lock()
		if b.relinks != relinks {
			// A reload came during the dial: this link has the old
			// settings, and the reload found nothing to close.
			b.mu.Unlock()
			_ = c.Close()
			b.log.Info("bridge reconfigured while connecting; connecting again")
			continue
		}
		b.client = c
		b.info = c.Info()
		b.window = c.Window()
		b.reconnects++
		b.mu.Unlock()
		b.setState(StateConnected, nil)
		b.connected(ctx, c)
		// The link has ended unless ctx is done: it is closed before the
		// in-routes are marked shut, so that no message the reader hands
		// over meanwhile is held while its acknowledgement goes upstream.
		_ = c.Close()
		b.mu.Lock()
		b.open = false
		b.client = nil
		b.mu.Unlock()
		err = c.Err()
		if ctx.Err() != nil {
			return
		}
		if err == nil {
			err = errors.New("connection closed")
		}
		b.setState(StateDown, err)
	}
}

// connected runs one connection: the in-routes are subscribed, the
// availability marked online, and the outbox sent until the link ends.
func (b *Bridge) connected(ctx context.Context, c *mqttclient.Client) {
	if !b.resume(c) {
		_ = c.Close()
		return
	}
	if err := b.subscribe(ctx, c); err != nil {
		b.log.Warn("subscribing the in-routes failed", "err", err)
		_ = c.Close()
		return
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
	b.send(ctx, c)
}

// subscribe opens the in-routes, giving overlapping filters their
// subscription identifiers, then hands held messages to them.
func (b *Bridge) subscribe(ctx context.Context, c *mqttclient.Client) error {
	rt := b.rt.Load()
	b.mu.Lock()
	stale := b.stale
	b.stale = nil
	b.mu.Unlock()
	if len(stale) > 0 {
		// In-routes removed by a reload: the upstream session still holds
		// their subscriptions.
		if err := c.Unsubscribe(ctx, stale); err != nil {
			b.mu.Lock()
			b.stale = append(b.stale, stale...)
			b.mu.Unlock()
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

// openRoutes marks the in-routes open and hands them the messages held
// while they were not.
func (b *Bridge) openRoutes(ctx context.Context) {
	b.inMu.Lock()
	defer b.inMu.Unlock()
	b.mu.Lock()
	b.open = true
	b.mu.Unlock()
	b.deliverHeld(ctx)
}

// flushHeld delivers, when run ends, the messages still held: each was
// acknowledged upstream as it was held, and no link opens the in-routes
// for it any more. The routes claim them as they would have on the next
// link.
func (b *Bridge) flushHeld() {
	b.inMu.Lock()
	defer b.inMu.Unlock()
	b.deliverHeld(context.Background())
}

// deliverHeld hands the held messages to the in-routes; the caller holds
// inMu.
func (b *Bridge) deliverHeld(ctx context.Context) {
	b.mu.Lock()
	held := b.held
	b.held = nil
	b.mu.Unlock()
	for _, m := range held {
		if !b.deliver(ctx, m) {
			b.mu.Lock()
			b.heldDrops++
			b.mu.Unlock()
			b.log.Warn("dropping an upstream message no in-route claims", "topic", m.Topic)
		}
	}
}

// onMessage handles a PUBLISH from the upstream, on the client's reader
// goroutine: its acknowledgement waits until the local publish is done.
func (b *Bridge) onMessage(m *mqttclient.Incoming) {
	ctx := context.Background()
	b.inMu.Lock()
	defer b.inMu.Unlock()
	b.mu.Lock()
	open := b.open
	b.mu.Unlock()
	if open && b.deliver(ctx, m) {
		return
	}
	// A resumed session's backlog can arrive before the subscriptions it
	// belongs to are open again: hold it, within bounds.
	cp := *m
	cp.Payload = bytes.Clone(m.Payload)
	b.mu.Lock()
	if len(b.held) >= maxHeld {
		b.held = b.held[1:]
		b.heldDrops++
		b.log.Warn("too many upstream messages wait for an in-route; the oldest is dropped", "limit", maxHeld)
	}
	b.held = append(b.held, &cp)
	b.mu.Unlock()
}

// deliver publishes m locally on every in-route that claims it: by its
// subscription identifiers when it has any, else by filter.
func (b *Bridge) deliver(ctx context.Context, m *mqttclient.Incoming) bool {
	b.mu.Lock()
	subIDs := b.info.SubIDsAvailable
	b.mu.Unlock()
	claimed := false
	rt := b.rt.Load()
	for i := range rt.ins {
		r := &rt.ins[i]
		if len(m.SubIDs) > 0 {
			if r.subID == 0 || !containsInt(m.SubIDs, r.subID) {
				continue
			}
		} else if r.subID != 0 && subIDs || !matcher.Matches(r.filter, m.Topic) {
			continue
		}
		claimed = true
		local, ok := r.topic.render(m.Topic)
		if !ok {
			b.log.Warn("in-route makes no valid local topic; dropped", "route", r.index, "topic", m.Topic)
			continue
		}
		qos := min(m.QoS, byte(r.QoS))
		// The broker keeps the payload; the client's buffer is not ours.
		if err := b.local.Publish(ctx, local, bytes.Clone(m.Payload), qos, m.Retain); err != nil {
			b.log.Warn("publishing an upstream message locally failed", "topic", local, "err", err)
		}
		b.mu.Lock()
		b.inbound++
		b.mu.Unlock()
	}
	return claimed
}

func containsInt(s []int, v int) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// send hands outbox entries to the link within its window and the pace,
// until the link ends or ctx is done.
func (b *Bridge) send(ctx context.Context, c *mqttclient.Client) {
	pace := newPacer(b.rt.Load().cfg.Rate, max(c.Window(), 1))
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		for _, m := range b.ob.takeMemory() {
			_, _ = c.Publish(&mqttclient.Outgoing{Topic: m.topic, Payload: m.payload, QoS: 0, Retain: m.retain}, func(error, byte) {})
		}
		// A record failed lately: nothing QoS 2 may go without one.
		held := time.Now().Before(b.recordHold)
		if !held {
			b.release(c)
		}
		// Entries are read from the file in runs: with a full window
		// waiting for a quarter of it to free up costs a little latency
		// and saves a read transaction per acknowledgement.
		if free, in := c.Window()-c.Inflight(), c.Inflight(); !held && free > 0 && (in == 0 || free >= max(1, c.Window()/4)) && b.ob.pending() {
			if n := pace.take(min(free, 64)); n > 0 {
				entries := b.ob.next(n)
				pids, ready := b.prepare(c, entries)
				for i := range entries {
					if i < ready {
						if err := b.send1(c, &entries[i], pids[i], false); err == nil {
							continue
						}
					}
					// The link is going (or its window closed, or a
					// record failed): this entry and the rest go again
					// later, under new identifiers.
					b.unprepare(c, entries[i:], pids[i:])
					break
				}
				if in := c.Inflight(); in > 0 {
					b.mu.Lock()
					b.peak = max(b.peak, in)
					b.mu.Unlock()
				}
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
		case <-tick.C:
			b.ob.flushDeletes()
			b.alive()
		}
	}
}

// resume deals with what was in flight on the last link: with the session
// present upstream it is sent again under its packet identifiers (PUBREL
// for a QoS 2 message past PUBREC); without, the outbox cursor goes back
// and it is sent as new. It reports false when the link failed meanwhile.
func (b *Bridge) resume(c *mqttclient.Client) bool {
	b.mu.Lock()
	flights := b.flights
	b.flights, b.byPID, b.recs = map[uint64]*outFlight{}, map[uint16]*outFlight{}, nil
	b.mu.Unlock()
	if len(flights) == 0 {
		return true
	}
	if !c.Info().SessionPresent {
		// The server kept nothing of ours: the records describe nothing.
		// Their deletes go ahead of any record made for the new session.
		if db := b.opts.Store; db != nil {
			var batch storage.Batch
			for seq, f := range flights {
				if f.recorded || f.released {
					batch.OutboxFlightDelete(b.name, seq)
				}
			}
			db.CommitLazy(&batch)
		}
		b.ob.rewind()
		return true
	}
	seqs := make([]uint64, 0, len(flights))
	for seq := range flights {
		seqs = append(seqs, seq)
	}
	slices.Sort(seqs)
	entries := make(map[uint64]*storage.OutboxEntry, len(seqs))
	var batch storage.Batch
	for _, seq := range seqs {
		f := flights[seq]
		e := b.ob.entry(seq)
		if e == nil {
			continue // acknowledged after all (its delete is on disk)
		}
		entries[seq] = e
		if b.opts.Store == nil {
			f.released = f.released || f.recd
			continue
		}
		// Nothing of QoS 2 goes out before its record is on disk.
		switch {
		case f.recd && !f.released:
			batch.OutboxFlightPut(b.name, &storage.OutboxFlight{Seq: seq, PID: f.pid, Released: true, Stamp: b.nextStamp()})
		case f.pid != 0 && !f.released && !f.recorded && min(e.Msg.QoS, c.Info().MaxQoS) == 2:
			batch.OutboxFlightPut(b.name, &storage.OutboxFlight{Seq: seq, PID: f.pid, Stamp: b.nextStamp()})
		}
	}
	if !batch.Empty() {
		if err := b.opts.Store.CommitWait(&batch); err != nil {
			b.recordFailed("recording QoS 2 messages in flight failed; the link is closed to try again", err)
			b.restore(flights)
			return false
		}
		for _, f := range flights {
			f.released = f.released || f.recd
			f.recorded = f.recorded || f.pid != 0
		}
	}
	for i, seq := range seqs {
		f, e := flights[seq], entries[seq]
		if e == nil {
			continue
		}
		var err error
		switch {
		case f.pid == 0:
			// It never had an identifier (QoS 0, or the link went
			// before it was written): it goes as new, in its turn.
			b.ob.unsend(seq)
			continue
		case f.released:
			b.track(f)
			done := b.done(seq, e.Msg.Topic)
			err = c.Release(f.pid, func(err error, reason byte) {
				if reason == rcPacketIDNotFound {
					// The server completed it before: the PUBCOMP that
					// said so was lost, or its outbox delete was.
					reason = 0
				}
				done(err, reason)
			})
		default:
			err = b.send1(c, e, f.pid, true)
		}
		if err != nil {
			b.log.Warn("resending after a reconnect failed", "err", err)
			rest := map[uint64]*outFlight{}
			for _, s := range seqs[i:] {
				rest[s] = flights[s]
			}
			b.restore(rest)
			return false
		}
		b.mu.Lock()
		b.resumed++
		b.mu.Unlock()
	}
	return true
}

// rcPacketIDNotFound is the reason code of a PUBCOMP for a PUBREL whose
// packet identifier the server no longer holds.
const rcPacketIDNotFound = 0x92

// restore gives back flights that a failed resume did not resend, for the
// next link to resume.
func (b *Bridge) restore(flights map[uint64]*outFlight) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for seq, f := range flights {
		if _, taken := b.flights[seq]; !taken {
			b.flights[seq] = f
		}
	}
}

func (b *Bridge) nextStamp() uint64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.stamp++
	return b.stamp - 1
}

// prepare takes packet identifiers for the entries that go out at QoS 2
// and records them, durably, before any of them is sent. It returns the
// identifiers (0: the client picks one) and how many entries may go: all
// of them but those the window or a failed record left out.
func (b *Bridge) prepare(c *mqttclient.Client, entries []storage.OutboxEntry) (pids []uint16, ready int) {
	pids = make([]uint16, len(entries))
	db := b.opts.Store
	if db == nil {
		return pids, len(entries)
	}
	ready = len(entries)
	var batch storage.Batch
	for i := range entries {
		e := &entries[i]
		if min(e.Msg.QoS, c.Info().MaxQoS) < 2 {
			continue
		}
		pid, err := c.ReserveID()
		if err != nil {
			ready = i
			break
		}
		pids[i] = pid
		batch.OutboxFlightPut(b.name, &storage.OutboxFlight{Seq: e.Seq, PID: pid, Stamp: b.nextStamp()})
	}
	if batch.Empty() {
		return pids, ready
	}
	if err := db.CommitWait(&batch); err != nil {
		b.recordFailed("recording QoS 2 messages before sending them failed; they wait", err)
		return pids, 0
	}
	return pids, ready
}

// unprepare takes back entries handed out by next that were not sent:
// their reserved identifiers are given back and their records deleted
// (ahead of any later record, which may reuse an identifier), and they
// go again in their turn.
func (b *Bridge) unprepare(c *mqttclient.Client, entries []storage.OutboxEntry, pids []uint16) {
	var batch storage.Batch
	for i, e := range entries {
		if pids[i] != 0 {
			c.CancelID(pids[i])
			batch.OutboxFlightDelete(b.name, e.Seq)
		}
		b.ob.unsend(e.Seq)
	}
	if db := b.opts.Store; db != nil {
		db.CommitLazy(&batch)
	}
}

// recordWarnEvery spaces the warnings of a failing QoS 2 record, which is
// retried every second while the disk is full.
const recordWarnEvery = 30 * time.Second

// recordFailed holds the sender back for a second after a QoS 2 record
// failed, and says so, at most once per recordWarnEvery.
func (b *Bridge) recordFailed(msg string, err error) {
	now := time.Now()
	b.recordHold = now.Add(time.Second)
	if now.Sub(b.recordWarned) >= recordWarnEvery {
		b.recordWarned = now
		b.log.Warn(msg, "err", err)
	}
}

// onPubrec is the client's OnPubrec: the PUBREL for pid waits until the
// send loop has recorded that the server received the message.
func (b *Bridge) onPubrec(pid uint16) {
	b.mu.Lock()
	b.recs = append(b.recs, pid)
	b.mu.Unlock()
	b.ob.signal()
}

// release records the PUBRECs that came since the last call as released,
// in one commit, then sends their PUBRELs.
func (b *Bridge) release(c *mqttclient.Client) {
	b.mu.Lock()
	recs := b.recs
	b.recs = nil
	var batch storage.Batch
	var fs []*outFlight
	var strays []uint16
	for _, pid := range recs {
		if f := b.byPID[pid]; f != nil {
			b.stamp++
			batch.OutboxFlightPut(b.name, &storage.OutboxFlight{Seq: f.seq, PID: pid, Released: true, Stamp: b.stamp - 1})
			fs = append(fs, f)
		} else {
			strays = append(strays, pid)
		}
	}
	b.mu.Unlock()
	for _, pid := range strays {
		_ = c.ReleaseHeld(pid) // no record to keep: never hold a flight for good
	}
	if len(fs) == 0 {
		return
	}
	if err := b.opts.Store.CommitWait(&batch); err != nil {
		b.recordFailed("recording QoS 2 receipts failed; their PUBRELs wait", err)
		b.mu.Lock()
		b.recs = append(recs, b.recs...)
		b.mu.Unlock()
		return
	}
	b.mu.Lock()
	for _, f := range fs {
		f.released = true
	}
	b.mu.Unlock()
	for _, f := range fs {
		// An error means the link ended: the teardown reports the flight
		// as past PUBREC, and the next link sends the PUBREL.
		_ = c.ReleaseHeld(f.pid)
	}
}

func (b *Bridge) track(f *outFlight) {
	b.mu.Lock()
	b.flights[f.seq] = f
	if f.pid != 0 {
		b.byPID[f.pid] = f
	}
	b.mu.Unlock()
}

// untrack forgets entry seq's flight.
func (b *Bridge) untrack(seq uint64) {
	b.mu.Lock()
	b.untrackLocked(seq)
	b.mu.Unlock()
}

func (b *Bridge) untrackLocked(seq uint64) {
	if f := b.flights[seq]; f != nil && b.byPID[f.pid] == f {
		delete(b.byPID, f.pid)
	}
	delete(b.flights, seq)
}

// done is the completion of entry seq upstream.
func (b *Bridge) done(seq uint64, topic string) func(error, byte) {
	return func(err error, reason byte) {
		if err != nil {
			if errors.Is(err, mqttclient.ErrReleasePending) {
				b.mu.Lock()
				if f := b.flights[seq]; f != nil {
					f.recd = true
				}
				b.mu.Unlock()
			}
			return // the link failed; resume or rewind deals with it
		}
		why := ""
		if reason >= 0x80 {
			why = DropRejected
			b.log.Warn("upstream refused a message; it is dropped", "topic", topic, "reason", fmt.Sprintf("0x%02X", reason))
		}
		b.mu.Lock()
		b.untrackLocked(seq)
		b.acked++
		b.mu.Unlock()
		b.ob.acked(seq, topic, why)
		b.ob.signal()
	}
}

// send1 publishes one outbox entry under pid (0: the client picks one);
// dup marks a resend under the identifier it had.
func (b *Bridge) send1(c *mqttclient.Client, e *storage.OutboxEntry, pid uint16, dup bool) error {
	seq, topic := e.Seq, e.Msg.Topic
	m := &mqttclient.Outgoing{Topic: topic, Payload: e.Msg.Payload, QoS: e.Msg.QoS, Retain: e.Msg.Retain, PacketID: pid, Dup: dup}
	f := &outFlight{seq: seq, pid: pid, recorded: pid != 0 && b.opts.Store != nil && min(e.Msg.QoS, c.Info().MaxQoS) == 2}
	b.track(f) // before Publish: its completion may come at once
	got, err := c.Publish(m, b.done(seq, topic))
	switch {
	case err == nil:
		b.mu.Lock()
		if f.pid == 0 && got != 0 {
			f.pid = got
			b.byPID[got] = f
		}
		b.sent++
		b.mu.Unlock()
		return nil
	case errors.Is(err, mqttclient.ErrTooLarge):
		// The server will never take it: retrying would stop the route.
		b.untrack(seq)
		c.CancelID(pid)
		b.log.Warn("message larger than the upstream accepts; it is dropped", "topic", topic, "bytes", len(e.Msg.Payload))
		b.ob.acked(seq, topic, DropTooLarge)
		return nil
	default:
		b.untrack(seq)
		return err
	}
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
	beat := time.NewTicker(time.Second / 2)
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

// Stats is a bridge's link and outbox, for metrics and the status page.
type Stats struct {
	Name       string
	State      string // connecting, connected, down or stopped
	Since      time.Time
	LastError  string
	Protocol   byte // 5 or 4 once connected
	Depth      int  // messages in the outbox
	Bytes      int64
	OldestAge  time.Duration
	Sent       uint64 // messages handed to the link
	Acked      uint64 // acknowledged by the upstream
	Inbound    uint64 // upstream messages published locally
	Reconnects uint64 // connections made
	Dropped    map[string]uint64
	// Window is the in-flight limit of the current (or last) link: the
	// smaller of max_inflight and the server's Receive Maximum.
	Window       int
	PeakInflight int    // the most messages seen in flight at once
	Resumed      uint64 // resent under their packet identifiers after a reconnect with the session present
}

// Stats returns a snapshot of the bridge.
func (b *Bridge) Stats() Stats {
	b.ob.mu.Lock()
	st := Stats{Depth: b.ob.count, Bytes: b.ob.bytes, Dropped: make(map[string]uint64, len(b.ob.dropped)+1)}
	for k, v := range b.ob.dropped {
		st.Dropped[k] = v
	}
	b.ob.mu.Unlock()
	if t := b.ob.oldest(); !t.IsZero() {
		st.OldestAge = time.Since(t)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	st.Name, st.State, st.Since, st.LastError = b.name, b.state, b.since, b.lastErr
	st.Protocol = b.info.Version
	st.Sent, st.Acked, st.Inbound, st.Reconnects = b.sent, b.acked, b.inbound, b.reconnects
	st.Window, st.PeakInflight, st.Resumed = b.window, b.peak, b.resumed
	if b.heldDrops > 0 {
		st.Dropped["unclaimed"] = b.heldDrops
	}
	return st
}
