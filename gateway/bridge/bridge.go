package bridge

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fieldgate/fieldgate/gateway/bridge/mqttclient"
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

// Bridge carries messages between the local broker and one upstream
// broker: out-routes through a durable outbox, in-routes back to local
// subscribers.
type Bridge struct {
	// Set by New, and by Start before its goroutines begin; only read
	// after that.
	name   string
	opts   Options
	log    *slog.Logger
	local  Local
	cancel context.CancelFunc
	wg     sync.WaitGroup // the run and expiry goroutines

	// Safe for concurrent use on their own.
	ob       *outbox                 // the out-routes' durable queue
	rt       atomic.Pointer[routing] // replaced whole by Reconfigure, under shared.mu with relinks
	flights  *flightTable            // the outbox entries in flight upstream
	received mqttclient.Received     // inbound QoS 2 identifiers, across reconnects
	dead     deadLetters             // serialises the moves into and out of the dead letters
	// progress counts the acknowledgements of our QoS 1/2 messages from
	// the upstream (PUBACK, PUBCOMP): a link under which it moved
	// delivered something.
	progress atomic.Uint64
	// refused holds the entries the upstream acknowledged with a refusal
	// (a reason code of 0x80 or more), for the run goroutine to move to
	// the dead letters: the reader that hears the refusal must not wait
	// for the commit.
	refused struct {
		mu   sync.Mutex
		list []refusal
	}

	// loop belongs to the run goroutine, and to New before it starts.
	loop struct {
		tracked bool // storage records this bridge's QoS 2 flights
		// A failed QoS 2 record (a full or failing disk) holds the
		// sender back until recordHold, and is logged at most once per
		// recordWarnEvery.
		recordHold, recordWarned time.Time

		// failing counts the dials and links in a row that delivered
		// nothing (see health.go), since failingSince; the backoff grows
		// with it. trouble is the kind of failure the log said last, ""
		// while the link is healthy.
		failing      int
		failingSince time.Time
		trouble      string
		// link numbers the links, for the flights sent on each.
		link uint64
		// suspect is the outbox entry the last links ended on, strikes
		// how many links in a row (see suspect.go); 0 and 0: none.
		suspect uint64
		strikes int
		// maxQoS is the highest QoS the current link carries: the
		// server's Maximum QoS, lowered by what was learned.
		maxQoS byte
	}

	// in is the inbound side. Its mu orders delivery: the reader's
	// messages and the backlog handed over when the in-routes open go one
	// at a time, so none is held after the hand-over and none overtakes
	// the backlog.
	in struct {
		mu   sync.Mutex
		open bool                   // the in-routes are subscribed
		held []*mqttclient.Incoming // what came while they were not, up to maxHeld
	}

	// shared is the link's state and the counters, which the run
	// goroutine, the client's callbacks, Reconfigure and Stats share; its
	// mu guards every field. It is taken after in.mu, never before.
	shared struct {
		mu      sync.Mutex
		state   string
		lastErr string
		since   time.Time
		info    mqttclient.Info
		window  int
		client  *mqttclient.Client // the current link, nil while down
		stale   []string           // in-route filters to unsubscribe on the next link
		// relinks counts the reloads that replace the link: one that
		// lands while run dials finds no client to close, and run,
		// seeing the count moved, closes the link it dialled with the
		// old settings.
		relinks uint64

		reconnects uint64
		sent       uint64
		acked      uint64
		inbound    uint64
		heldDrops  uint64
		peak       int    // the most QoS 1/2 messages seen in flight at once
		resumed    uint64 // messages resent under their identifiers after a reconnect
		failing    int    // loop.failing, for Stats

		// learned is what the upstream showed it does not take, kept
		// for the bridge's life and forgotten when a reload changes the
		// link's settings (see learned.go).
		learned learned
	}
}

// routing is a bridge's configuration as compiled: swapped whole, so that
// a reload never shows a half-changed set of routes.
type routing struct {
	cfg    Config
	outs   []outRoute
	ins    []inRoute
	copts  mqttclient.Options
	online *outRoute // the out-route that carries the availability topic
	remote string    // its remote topic
}

// Link states, as reported in Stats.
const (
	StateConnecting = "connecting"
	StateConnected  = "connected"
	StateDown       = "down"
	StateStopped    = "stopped"
)

// Name returns the bridge's configured name.
func (b *Bridge) Name() string { return b.name }

// LocalID is the in-process client id the bridge must publish inbound
// messages as: what that client publishes is never offered back out.
func (b *Bridge) LocalID() string { return "fieldgate-bridge-" + b.name }

// ErrOutboxFull is Offer's answer when an alarm route refused a message
// because the outbox is full.
var ErrOutboxFull = errors.New("the outbox is full, and an alarm route never drops what it holds")

// Offer queues a routed local message on every out-route it matches,
// into batch, before the publisher is acknowledged. It returns nil, or why
// a route refused the message: a *TopicRuleError (ErrTopicRules) when the
// topic a route makes breaks the upstream's topic rules, which a retry
// cannot mend, else ErrOutboxFull when an alarm route found the outbox
// full. What the bridge's own client published (messages that came in)
// is never sent back out.
func (b *Bridge) Offer(topic string, payload []byte, retain bool, from string, batch *storage.Batch) error {
	if from == b.LocalID() {
		return nil
	}
	var refused error
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
		if e := r.rules.check(remote); e != nil {
			b.refuseTopic(r, topic, e)
			refused = e
			continue
		}
		if now.IsZero() {
			now = time.Now()
		}
		if !b.ob.put(r, remote, payload, retain || r.Retain, batch, now) && refused == nil {
			refused = ErrOutboxFull
		}
	}
	return refused
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
	// DeadLetters are the messages the upstream kept refusing, kept
	// aside in the state file; DeadLetterBytes their size as bounded by
	// max_dead_letter_bytes.
	DeadLetters     int
	DeadLetterBytes int64
	DeadLettered    uint64 // messages moved to the dead letters since the start
	// Failing counts the connection attempts in a row that delivered
	// nothing (refused, or closed before an acknowledgement came); 0
	// while the link is healthy.
	Failing int
	// QoSLimit is the highest QoS this bridge sends the upstream: 2,
	// unless the server's Maximum QoS (MQTT 5) or a refused QoS 2 publish
	// (MQTT 3.1.1) lowered it.
	QoSLimit byte
}

// Stats returns a snapshot of the bridge.
func (b *Bridge) Stats() Stats {
	b.ob.mu.Lock()
	st := Stats{Depth: b.ob.count, Bytes: b.ob.bytes, Dropped: make(map[string]uint64, len(b.ob.dropped)+1),
		DeadLetters: b.ob.dead.count, DeadLetterBytes: b.ob.dead.bytes, DeadLettered: b.ob.dead.moved}
	for k, v := range b.ob.dropped {
		st.Dropped[k] = v
	}
	b.ob.mu.Unlock()
	if t := b.ob.oldest(); !t.IsZero() {
		st.OldestAge = time.Since(t)
	}
	b.shared.mu.Lock()
	defer b.shared.mu.Unlock()
	st.Name, st.State, st.Since, st.LastError = b.name, b.shared.state, b.shared.since, b.shared.lastErr
	st.Protocol = b.shared.info.Version
	st.Sent, st.Acked, st.Inbound, st.Reconnects = b.shared.sent, b.shared.acked, b.shared.inbound, b.shared.reconnects
	st.Window, st.PeakInflight, st.Resumed = b.shared.window, b.shared.peak, b.shared.resumed
	st.Failing, st.QoSLimit = b.shared.failing, b.shared.learned.limit()
	if b.shared.heldDrops > 0 {
		st.Dropped["unclaimed"] = b.shared.heldDrops
	}
	return st
}
