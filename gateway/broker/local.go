package broker

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fieldgate/fieldgate/matcher"
	"github.com/mochi-mqtt/server/v2/packets"
)

// Message is an application message as an in-process client sees it.
type Message struct {
	Topic   string
	Payload []byte // shared with other receivers: do not modify
	QoS     byte
	Retain  bool
}

// Handler receives the messages of one in-process subscription. Handlers
// of one client run one at a time, in order, on the client's own
// goroutine; a slow handler delays only its own client.
type Handler func(Message)

// Client is an in-process client: the sensors, the bridge and actuators
// publish and subscribe through it, on the same router as network
// clients, without a socket. Its deliveries are bounded like a network
// client's (broker.max_queued_bytes and the inflight window), so a slow
// handler loses QoS 0 messages past its budget rather than stalling
// publishers. In-process clients are trusted: the ACL does not apply.
type Client struct {
	b *Broker
	c *conn

	inHandler atomic.Bool // a handler is running on the delivery goroutine

	mu       sync.Mutex
	handlers map[uint32]Handler // by subscription identifier
	filters  map[string]uint32
	nextID   uint32
}

// ErrClientClosed is returned by a Client used after Close.
var ErrClientClosed = errors.New("broker: in-process client closed")

// ErrQueueFull is returned by Publish when a persistent session's queue
// policy, or a bridge's full alarm outbox, refused the message (it
// reached every other receiver).
var ErrQueueFull = errors.New("a queue the message must go to is full (a subscriber's, or a bridge's outbox)")

// ErrTopicRefused is returned by Publish when an Outbound refused the
// message's topic, as a bridge does for a topic its upstream's topic
// rules forbid (it reached every local receiver). An Outbound's Offer
// returns it too.
var ErrTopicRefused = errors.New("a bridge's upstream does not take this topic (bridges[].topic_rules)")

// ErrSysTopic is returned by Publish for a $SYS topic: they are the
// broker's own.
var ErrSysTopic = errors.New("$SYS topics are the broker's own; clients may not publish to them")

// Connect opens an in-process client session under clientID, which must
// not be used by network clients. The session ends when the client closes.
func (b *Broker) Connect(clientID string) (*Client, error) {
	if clientID == "" {
		return nil, errors.New("broker: in-process client: empty client id")
	}
	c := newConn(b, nil, "in-process")
	c.clientID = clientID
	c.v5 = true
	c.window = b.opts.MaxInflight
	cl := &Client{b: b, c: c, handlers: make(map[uint32]Handler), filters: make(map[string]uint32)}
	c.local = cl
	if err := b.attach(c, true, 0, nil, func(bool) {}); err != nil {
		return nil, fmt.Errorf("broker: in-process client %q: %w", clientID, err)
	}
	b.stats.connected.Add(1)
	return cl, nil
}

// Publish routes a message to every matching subscriber and returns once it
// has been routed (queued, in flight or counted as dropped for each). ctx
// bounds the wait; an expired ctx publishes nothing. The broker keeps
// payload without copying it: the caller must not change it afterwards.
func (cl *Client) Publish(ctx context.Context, topic string, payload []byte, qos byte, retain bool) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if cl.c.closingNow() {
		return ErrClientClosed
	}
	if err := matcher.ValidateTopic(topic); err != nil {
		return fmt.Errorf("broker: publish: %w", err)
	}
	if matcher.IsSys(topic) {
		return fmt.Errorf("broker: publish to %q: %w", topic, ErrSysTopic)
	}
	if qos > 2 {
		return fmt.Errorf("broker: publish to %q: QoS %d; use 0, 1 or 2", topic, qos)
	}
	cl.b.stats.msgsRecv.Add(1)
	fx := effectsPool.Get().(*effects)
	m := newMessage(topic, payload, qos, retain, nil, time.Now())
	m.local = true
	cl.b.publish(m, cl.c.s.handle, fx)
	if fx.batch.Empty() && len(fx.release) == 0 {
		// Nothing to store and nobody waiting on it: the common case of a
		// reading that only live subscribers get. fx goes back for reuse.
		err := fx.refusal(qos)
		fx.refused, fx.topicRefused = false, false
		effectsPool.Put(fx)
		if err != nil {
			return fmt.Errorf("broker: publish to %q: %w", topic, err)
		}
		return nil
	}
	if qos == 0 {
		cl.b.commitLazy(fx)
		return nil
	}
	// QoS 1/2 returns once stored: the caller is held back at the pace the
	// state file can take, which is the back-pressure a sensor loop needs.
	done := make(chan error, 1)
	cl.b.commitEffects(fx, true, func(err error) { done <- err })
	select {
	case err := <-done:
		if err != nil {
			return fmt.Errorf("broker: publish to %q not stored: %w", topic, err)
		}
		if err := fx.refusal(qos); err != nil {
			return fmt.Errorf("broker: publish to %q: %w", topic, err)
		}
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Subscribe adds a subscription whose messages go to h; subscribing again
// to the same filter replaces its QoS and handler. Retained messages are
// delivered to h as for a network client's new subscription.
func (cl *Client) Subscribe(filter string, qos byte, h Handler) error {
	if err := matcher.ValidateFilter(filter); err != nil {
		return fmt.Errorf("broker: subscribe: %w", err)
	}
	if qos > 2 {
		return fmt.Errorf("broker: subscribe to %q: QoS %d; use 0, 1 or 2", filter, qos)
	}
	if cl.c.closingNow() {
		return ErrClientClosed
	}
	cl.mu.Lock()
	id, ok := cl.filters[filter]
	if !ok {
		cl.nextID++
		id = cl.nextID
		cl.filters[filter] = id
	}
	cl.handlers[id] = h
	cl.mu.Unlock()
	var retained []retainedFor
	code, err := cl.c.subscribeOne(packets.Subscription{Filter: filter, Qos: qos}, id, func(w retainedFor) {
		retained = append(retained, w)
	})
	if errors.Is(err, errSessionEnded) {
		return ErrClientClosed
	}
	cl.c.s.sendRetained(cl.b, nil, retained, []uint32{id})
	if err == nil && code >= 0x80 {
		err = fmt.Errorf("broker: subscribe to %q refused with reason 0x%02X", filter, code)
	}
	return err
}

// refusal is what an in-process publisher of QoS qos is told of what fx
// records: nothing at QoS 0, as a network client is told nothing; a
// refused topic before a full queue, as serve.go tells an MQTT 5 client.
func (fx *effects) refusal(qos byte) error {
	switch {
	case qos == 0:
		return nil
	case fx.topicRefused:
		return ErrTopicRefused
	case fx.refused:
		return ErrQueueFull
	}
	return nil
}

// effectsPool recycles the effects of in-process publishes that stored
// nothing; those handed to storage are not reused.
var effectsPool = sync.Pool{New: func() any { return new(effects) }}

// RetainedTopics lists the topics holding a retained message that filter
// matches, such as the discovery configs a gateway published earlier.
func (cl *Client) RetainedTopics(filter string) []string {
	var out []string
	cl.b.retained.match(filter, math.MaxUint64, func(m *message) { out = append(out, m.topic) })
	return out
}

// Unsubscribe removes the subscription to filter.
func (cl *Client) Unsubscribe(filter string) {
	s := cl.c.s
	s.mu.Lock()
	if _, ok := s.subs[filter]; ok {
		cl.b.index.Unsubscribe(s.handle, filter)
		delete(s.subs, filter)
		s.endScansLocked(filter)
	}
	s.mu.Unlock()
	cl.mu.Lock()
	if id, ok := cl.filters[filter]; ok {
		delete(cl.filters, filter)
		delete(cl.handlers, id)
	}
	cl.mu.Unlock()
}

// Close ends the client's session after its queued messages are handled.
// It may be called from one of the client's own handlers, which run on
// the goroutine Close would otherwise wait for; it then returns at once and
// the session ends when the handler returns.
func (cl *Client) Close() {
	cl.c.shutdown(noDisconnect, "")
	if cl.inHandler.Load() {
		go func() {
			<-cl.c.done
			cl.b.detach(cl.c, true)
		}()
		return
	}
	<-cl.c.done
	cl.b.detach(cl.c, true)
}

// dispatchAll hands a batch to the handlers and returns the queue bytes
// it held; QoS 1/2 messages count as acknowledged once handled.
func (cl *Client) dispatchAll(items []outItem) int {
	n := 0
	for i := range items {
		it := &items[i]
		n += it.size()
		if it.d.msg != nil {
			cl.inHandler.Store(true)
			cl.dispatch(it)
			cl.inHandler.Store(false)
			cl.b.stats.msgsSent.Add(1)
		}
	}
	return n
}

func (cl *Client) dispatch(it *outItem) {
	d := &it.d
	m := Message{Topic: d.msg.topic, Payload: d.msg.payload, QoS: d.qos, Retain: d.retain}
	cl.mu.Lock()
	hs := make([]Handler, 0, len(d.subIDs))
	for _, id := range d.subIDs {
		if h := cl.handlers[id]; h != nil {
			hs = append(hs, h)
		}
	}
	cl.mu.Unlock()
	for _, h := range hs {
		h(m)
	}
	if d.qos > 0 {
		cl.c.s.discard(it.pid)
	}
}
