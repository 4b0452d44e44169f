package mqttclient

import (
	"fmt"
	"strings"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/fieldgate/fieldgate/internal/mqttwire"
)

// busyRecheck is how soon the watchdog looks again when a PINGREQ is due
// but the write queue is not empty: whatever is queued resets the keep
// alive once written, and a stuck write has its own deadline.
const busyRecheck = 100 * time.Millisecond

var pingreq = []byte{packets.Pingreq << 4, 0}

// ackWait is one acknowledgement the connection waits for. The writer sets
// its deadline when the packet that asks for it has been written; the
// watchdog ends the connection when one is overdue.
type ackWait struct {
	kind     byte // the packet type awaited
	pid      uint16
	deadline time.Time
	got      bool
}

func (w *ackWait) String() string {
	if w.kind == packets.Pingresp {
		return "PINGRESP"
	}
	return fmt.Sprintf("%s for packet id %d", strings.ToUpper(mqttwire.PacketName(w.kind)), w.pid)
}

// watch is the watchdog goroutine: keep alive and overdue acks.
func (c *Client) watch() {
	defer c.wg.Done()
	t := time.NewTimer(0) // the first check says when the next is due
	defer t.Stop()
	for {
		select {
		case <-c.stop:
			return
		case <-t.C:
		}
		now := time.Now()
		next, err := c.check(now)
		if err != nil {
			c.fail(err)
			return
		}
		t.Reset(next.Sub(now))
	}
}

// check fails an overdue acknowledgement, queues a PINGREQ when one is
// due, and returns when to look again.
func (c *Client) check(now time.Time) (time.Time, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	i := 0
	for i < len(c.acks) && c.acks[i].got {
		i++
	}
	if i > 0 {
		c.acks = c.acks[:copy(c.acks, c.acks[i:])]
	}
	// Anything awaited later than now is written later, so its deadline
	// is later than this.
	next := now.Add(c.o.AckTimeout)
	if len(c.acks) > 0 {
		w := c.acks[0]
		if !now.Before(w.deadline) {
			return now, fmt.Errorf("%w: no %s from %s within %v", ErrHalfOpen, w, c.desc, c.o.AckTimeout)
		}
		next = w.deadline
	}
	if c.keepAlive > 0 {
		// The keep alive is counted from our last write whether or not a
		// PINGREQ is in flight: a check made while one was (a caller's
		// Ping, say) must not sleep past the next one that falls due
		// once it is answered [MQTT-3.1.2-23].
		due := c.lastSent.Add(c.keepAlive)
		if !now.Before(due) {
			switch w := (&ackWait{kind: packets.Pingresp}); {
			case len(c.pings) > 0:
				// One is in flight, answered within its own deadline.
				due = now.Add(busyRecheck)
			case c.q.tryPush(outPacket{b: pingreq, wait: w}):
				c.pings = append(c.pings, pingWait{wait: w})
				due = now.Add(c.keepAlive)
			default:
				due = now.Add(busyRecheck)
			}
		}
		if due.Before(next) {
			next = due
		}
	}
	return next, nil
}
