package broker

import (
	"fmt"
	"testing"
	"time"

	"github.com/fieldgate/fieldgate/internal/testkit"
	"github.com/fieldgate/fieldgate/matcher"
	"github.com/fieldgate/fieldgate/storage"
	"github.com/mochi-mqtt/server/v2/packets"
)

// A publish builds its batch while it routes, and hands it to storage only
// once routing is done; meanwhile another publish, or a subscriber's
// acknowledgement, can reach storage first. These tests hold a publish's
// batch back, as a preempted publisher would, and check what the file
// holds afterwards.

// TestRetainedBatchesOutOfOrder: two retained publishes to one topic
// whose batches reach storage in the opposite order of their routing
// leave the later one retained, in memory and in the file, durable or
// lazily committed.
func TestRetainedBatchesOutOfOrder(t *testing.T) {
	for _, durable := range []bool{true, false} {
		t.Run(fmt.Sprintf("durable=%v", durable), func(t *testing.T) {
			sb := newStoredBroker(t, nil)
			b := sb.tb.Broker
			fxA, fxB := &effects{}, &effects{}
			b.publish(newMessage("dev/state", []byte("older"), 1, true, nil, time.Now()), matcher.NoHandle, fxA)
			b.publish(newMessage("dev/state", []byte("newer"), 1, true, nil, time.Now()), matcher.NoHandle, fxB)
			done := make(chan error, 2)
			b.commitEffects(fxB, durable, func(err error) { done <- err })
			b.commitEffects(fxA, durable, func(err error) { done <- err })
			for range 2 {
				if err := <-done; err != nil {
					t.Fatal(err)
				}
			}
			if err := sb.db.CommitWait(&storage.Batch{}); err != nil {
				t.Fatal(err)
			}
			sb.db.After(func(error) { done <- nil })
			<-done // both batches applied
			check := func(when string) {
				t.Helper()
				var got []string
				sb.tb.Broker.retained.match("dev/state", ^uint64(0), func(m *message) { got = append(got, string(m.payload)) })
				if len(got) != 1 || got[0] != "newer" {
					t.Errorf("%s: retained %q, want [newer], the one routed last", when, got)
				}
			}
			// The in-memory copy of the change goes once the file has it.
			deadline := time.Now().Add(testkit.Scale(5 * time.Second))
			for {
				sb.tb.Broker.retained.tidy()
				sb.tb.Broker.retained.mu.RLock()
				n := len(sb.tb.Broker.retained.recent)
				sb.tb.Broker.retained.mu.RUnlock()
				if n == 0 || time.Now().After(deadline) {
					if n != 0 {
						t.Errorf("the change is still held in memory after %v", testkit.Scale(5*time.Second))
					}
					break
				}
				time.Sleep(20 * time.Millisecond)
			}
			check("from the file")
			sb.restart()
			check("after a restart")
		})
	}
}

// TestAckOvertakesEnqueue: a persistent subscriber acknowledges a QoS 1
// message before the publish that queued it has handed its batch to
// storage. The record must not be left in the queue: it would be sent
// again after a restart and hold its bytes against the storage budget
// until then.
func TestAckOvertakesEnqueue(t *testing.T) {
	sb := newStoredBroker(t, nil)
	sub, _ := connectRaw(t, sb.addr, 5, "keeper", true, v5Expiry(3600))
	sub.subscribe(1, packets.Subscription{Filter: "p/#", Qos: 1})
	b := sb.tb.Broker

	fx := &effects{}
	b.publish(newMessage("p/t", []byte("early ack"), 1, false, nil, time.Now()), matcher.NoHandle, fx)
	if fx.batch.Empty() {
		t.Fatal("the publish stored nothing for the persistent subscriber")
	}
	sub.ackPublish(sub.expectPublish("p/t", "early ack", 1))
	sub.ping() // the PUBACK has been read
	applied := make(chan struct{})
	sb.db.After(func(error) { close(applied) })
	select {
	case <-applied: // ...and the lazy Dequeue it made is in the file
	case <-time.After(testkit.Scale(5 * time.Second)):
		t.Fatalf("storage did not apply the acknowledgement within %v", testkit.Scale(5*time.Second))
	}
	if err := sb.db.CommitWait(&fx.batch); err != nil {
		t.Fatal(err)
	}
	if n := sb.db.QueuedBytes(); n != 0 {
		t.Errorf("QueuedBytes %d after the acknowledgement, want 0", n)
	}
	sub.disconnect(0)
	v5WaitOffline(t, b, "keeper")
	sb.restart()
	c, ack := connectRaw(t, sb.addr, 5, "keeper", false, v5Expiry(3600))
	if !ack.SessionPresent {
		t.Fatal("session not present after the restart")
	}
	c.expectNone(300 * time.Millisecond)
}

// TestPromotedQoS2WaitsForItsBatch: a QoS 2 message queued behind a full
// window is promoted into it, by the client's completing the message
// ahead, before the publish that stored it has handed its batch over. It
// must not go to the client before that batch: a crash in between would
// lose it unacknowledged, its publisher would send it again, and the
// client would get it twice.
func TestPromotedQoS2WaitsForItsBatch(t *testing.T) {
	sb := newStoredBroker(t, nil)
	sub, _ := connectRaw(t, sb.addr, 5, "keeper", true, func(pk *packets.Packet) {
		v5SetExpiry(pk, 3600)
		pk.Properties.ReceiveMaximum = 1
	})
	sub.subscribe(1, packets.Subscription{Filter: "p/#", Qos: 2})
	pub, _ := connectRaw(t, sb.addr, 5, "writer", true, nil)
	pub.publish(rawPublish("p/t", "first", 2, false, 1))
	first := sub.expectPublish("p/t", "first", 2)

	b := sb.tb.Broker
	fx := &effects{}
	b.publish(newMessage("p/t", []byte("second"), 2, false, nil, time.Now()), matcher.NoHandle, fx)
	sub.ackPublish(first) // makes room: "second" is promoted
	sub.expectNone(300 * time.Millisecond)

	done := make(chan error, 1)
	b.commitEffects(fx, true, func(err error) { done <- err })
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	sub.ackPublish(sub.expectPublish("p/t", "second", 2))
	sub.quiet()
}

// TestFanOutLeavesNoQueueRecords: QoS 1 messages fanned out to many
// persistent subscribers that acknowledge at once leave no record in the
// stored queues. The first subscribers' acknowledgements routinely reach
// storage before the publish that queued their message has handed its
// batch over (it is still routing to the rest); each record left behind
// would be sent again after a restart and hold its bytes against
// storage.max_queued_bytes until then.
func TestFanOutLeavesNoQueueRecords(t *testing.T) {
	sb := newStoredBroker(t, nil)
	const subs, msgs = 30, 1000
	var cs []*rawClient
	for i := range subs {
		c, _ := connectRaw(t, sb.addr, 5, fmt.Sprint("fan-", i), true, v5Expiry(3600))
		c.subscribe(1, packets.Subscription{Filter: "f/#", Qos: 1})
		cs = append(cs, c)
	}
	errs := make(chan error, subs)
	for i, c := range cs {
		go func() {
			// Not the test's goroutine: errors are sent back, never fatal.
			for n := range msgs {
				pk, err := c.recv(testkit.Scale(20 * time.Second))
				if err == nil && pk.FixedHeader.Type != packets.Publish {
					err = fmt.Errorf("got %s", rawDescribe(pk))
				}
				if err == nil {
					// A deadline of its own: the one the SUBSCRIBE's write
					// left is long past once the fan-out has run a while.
					_ = c.nc.SetWriteDeadline(time.Now().Add(c.wait))
					_, err = c.nc.Write(c.encode(rawAck(packets.Puback, pk.PacketID, 0)))
				}
				if err != nil {
					errs <- fmt.Errorf("subscriber %d, message %d: %w", i, n, err)
					return
				}
			}
			errs <- nil
		}()
	}
	pub, _ := connectRaw(t, sb.addr, 5, "fan-writer", true, nil)
	for i := range msgs {
		pub.publish(rawPublish("f/t", fmt.Sprint(i), 1, false, uint16(i+1)))
	}
	for range subs {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range cs {
		c.ping() // its acknowledgements have been read
	}
	applied := make(chan struct{})
	sb.db.After(func(error) { close(applied) })
	<-applied
	if n := sb.db.QueuedBytes(); n != 0 {
		t.Errorf("QueuedBytes %d after every message was acknowledged, want 0", n)
	}
	left := 0
	if err := sb.db.Load(func(st *storage.SessionState) error { left += len(st.Queue); return nil }); err != nil {
		t.Fatal(err)
	}
	if left != 0 {
		t.Errorf("%d queue records left after every message was acknowledged, want 0", left)
	}
}

// TestUnstoredTicketsSwept: the tickets a session keeps for its pending
// QoS 2 messages do not pile up once their batches have gone to storage,
// however long the queue of a client that stays away.
func TestUnstoredTicketsSwept(t *testing.T) {
	sb := newStoredBroker(t, nil)
	sub, _ := connectRaw(t, sb.addr, 5, "away", true, v5Expiry(3600))
	sub.subscribe(1, packets.Subscription{Filter: "q/#", Qos: 2})
	sub.disconnect(0)
	v5WaitOffline(t, sb.tb.Broker, "away")
	pub, _ := connectRaw(t, sb.addr, 5, "writer", true, nil)
	const n = 300
	for i := range n {
		pub.publish(rawPublish("q/t", fmt.Sprint(i), 2, false, uint16(i+1)))
	}
	b := sb.tb.Broker
	b.mu.Lock()
	s := b.sessions["away"]
	b.mu.Unlock()
	s.mu.Lock()
	pending, kept := len(s.pending), len(s.unstored)
	s.mu.Unlock()
	if pending != n {
		t.Fatalf("%d pending, want %d", pending, n)
	}
	if kept > 64 {
		t.Errorf("%d tickets kept for %d pending messages whose batches have all gone, want at most 64", kept, n)
	}
	c, _ := connectRaw(t, sb.addr, 5, "away", false, func(pk *packets.Packet) {
		v5SetExpiry(pk, 3600)
		pk.Properties.ReceiveMaximum = 1 // one QoS 2 exchange at a time
	})
	for i := range n {
		c.ackPublish(c.expectPublish("q/t", fmt.Sprint(i), 2))
	}
	s.mu.Lock()
	kept = len(s.unstored)
	s.mu.Unlock()
	if kept != 0 {
		t.Errorf("%d tickets kept once the queue was delivered, want 0", kept)
	}
}
