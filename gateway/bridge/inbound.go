package bridge

import (
	"bytes"
	"context"

	"github.com/fieldgate/fieldgate/gateway/bridge/mqttclient"
)

// maxHeld bounds the inbound messages no open subscription claims yet (a
// resumed session's backlog arriving before the routes are subscribed).
const maxHeld = 1024

// openRoutes marks the in-routes open and hands them the messages held
// while they were not.
func (b *Bridge) openRoutes(ctx context.Context) {
	b.in.mu.Lock()
	defer b.in.mu.Unlock()
	b.in.open = true
	b.deliverHeld(ctx)
}

// flushHeld delivers, when run ends, the messages still held: each was
// acknowledged upstream as it was held, and no link opens the in-routes
// for it any more. The routes claim them as they would have on the next
// link.
func (b *Bridge) flushHeld() {
	b.in.mu.Lock()
	defer b.in.mu.Unlock()
	b.deliverHeld(context.Background())
}

// deliverHeld hands the held messages to the in-routes; the caller holds
// in.mu.
func (b *Bridge) deliverHeld(ctx context.Context) {
	held := b.in.held
	b.in.held = nil
	for _, m := range held {
		if !b.deliver(ctx, m) {
			b.shared.mu.Lock()
			b.shared.heldDrops++
			b.shared.mu.Unlock()
			b.log.Warn("dropping an upstream message no in-route claims", "topic", m.Topic)
		}
	}
}

// onMessage handles a PUBLISH from the upstream, on the client's reader
// goroutine: its acknowledgement waits until the local publish is done.
func (b *Bridge) onMessage(m *mqttclient.Incoming) {
	ctx := context.Background()
	b.in.mu.Lock()
	defer b.in.mu.Unlock()
	if b.in.open && b.deliver(ctx, m) {
		return
	}
	// A resumed session's backlog can arrive before the subscriptions it
	// belongs to are open again: hold it, within bounds.
	cp := *m
	cp.Payload = bytes.Clone(m.Payload)
	if len(b.in.held) >= maxHeld {
		b.in.held = b.in.held[1:]
		b.shared.mu.Lock()
		b.shared.heldDrops++
		b.shared.mu.Unlock()
		b.log.Warn("too many upstream messages wait for an in-route; the oldest is dropped", "limit", maxHeld)
	}
	b.in.held = append(b.in.held, &cp)
}

// deliver publishes m locally on every in-route that claims it: by its
// subscription identifiers when it has any, else by filter.
func (b *Bridge) deliver(ctx context.Context, m *mqttclient.Incoming) bool {
	b.shared.mu.Lock()
	subIDs := b.shared.info.SubIDsAvailable
	b.shared.mu.Unlock()
	claimed := false
	rt := b.rt.Load()
	for i := range rt.ins {
		r := &rt.ins[i]
		if len(m.SubIDs) > 0 {
			if r.subID == 0 || !containsInt(m.SubIDs, r.subID) {
				continue
			}
		} else if r.subID != 0 && subIDs || !receives(r.filter, m.Topic) {
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
		b.shared.mu.Lock()
		b.shared.inbound++
		b.shared.mu.Unlock()
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
