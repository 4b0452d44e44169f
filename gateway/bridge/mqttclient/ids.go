package mqttclient

import (
	"errors"
	"fmt"
	"sync"

	"github.com/fieldgate/fieldgate/internal/mqttwire"
)

// Received is the inbound QoS 2 state of a session: the packet ids of
// messages delivered and acknowledged with PUBREC but not yet released
// with PUBREL. Until the PUBREL, a PUBLISH with the same id is answered
// with PUBREC and not delivered again [MQTT-4.3.3-10]; the server resends
// one after a reconnect when our PUBREC was lost with the link. Share one
// Received between the successive connections of a session; Dial empties
// it when the server has no session. The zero value is ready to use.
type Received struct {
	mu  sync.Mutex
	ids map[uint16]struct{}
}

// Len returns the number of messages waiting for their PUBREL.
func (r *Received) Len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.ids)
}

func (r *Received) has(pid uint16) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ok := r.ids[pid]
	return ok
}

func (r *Received) add(pid uint16) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ids == nil {
		r.ids = make(map[uint16]struct{})
	}
	r.ids[pid] = struct{}{}
}

// release forgets pid and reports whether it was there.
func (r *Received) release(pid uint16) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ok := r.ids[pid]
	delete(r.ids, pid)
	return ok
}

func (r *Received) reset() {
	r.mu.Lock()
	defer r.mu.Unlock()
	clear(r.ids)
}

// ReserveID takes a packet identifier, and a place in the in-flight
// window, for a QoS 1/2 Publish to come: the caller can record the
// identifier before the PUBLISH goes out. Publish with m.PacketID set to
// it uses them; CancelID gives them back. A full window returns
// ErrWindowFull.
func (c *Client) ReserveID() (uint16, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.usableLocked(); err != nil {
		return 0, err
	}
	if len(c.flights)+len(c.reserved) >= c.window {
		return 0, ErrWindowFull
	}
	pid := c.allocIDLocked()
	if pid == 0 {
		return 0, errors.New("bridge: every packet id is in flight")
	}
	if c.reserved == nil {
		c.reserved = map[uint16]struct{}{}
	}
	c.reserved[pid] = struct{}{}
	return pid, nil
}

// Claim holds packet identifiers the server may still hold in our session
// (messages to resend under them later, after a reconnect with the session
// present), so that no new PUBLISH, SUBSCRIBE or UNSUBSCRIBE takes one
// meanwhile [MQTT-2.2.1-3]. Each takes a place in the window, as a
// ReserveID does, even past a full one: Publish with m.PacketID set to it,
// or Release, uses it; CancelID gives it back.
func (c *Client) Claim(pids []uint16) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.usableLocked(); err != nil {
		return err
	}
	for _, pid := range pids {
		if pid == 0 || c.inUseLocked(pid) {
			return fmt.Errorf("bridge: claim: packet id %d is 0 or in use", pid)
		}
	}
	if c.reserved == nil {
		c.reserved = map[uint16]struct{}{}
	}
	for _, pid := range pids {
		c.reserved[pid] = struct{}{}
	}
	return nil
}

// CancelID gives back an identifier from ReserveID that no Publish used.
func (c *Client) CancelID(pid uint16) {
	c.mu.Lock()
	delete(c.reserved, pid)
	c.mu.Unlock()
}

func (c *Client) inUseLocked(pid uint16) bool {
	_, a := c.flights[pid]
	_, b := c.ctrl[pid]
	_, r := c.reserved[pid]
	return a || b || r
}

// allocIDLocked returns a packet id no PUBLISH, SUBSCRIBE or UNSUBSCRIBE
// in flight holds [MQTT-2.2.1-3], or 0 when all are taken.
func (c *Client) allocIDLocked() uint16 {
	for range mqttwire.MaxPacketID {
		c.nextID++
		if c.nextID == 0 {
			c.nextID = 1
		}
		if !c.inUseLocked(c.nextID) {
			return c.nextID
		}
	}
	return 0
}
