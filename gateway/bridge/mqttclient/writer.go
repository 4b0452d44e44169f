package mqttclient

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"time"
)

// writeQueueBytes bounds the bytes waiting for (or in) a write. It is a
// few hundred typical sensor messages: enough to keep the link busy
// between the writer's wake-ups, small next to a Pi's memory. A single
// larger message still goes, alone.
const writeQueueBytes = 256 << 10

// I/O buffer sizes: one TCP segment or TLS record's worth and more.
const (
	readBufSize  = 16 << 10
	writeBufSize = 32 << 10
)

// progressWriter writes to the socket in chunks, each with its own
// deadline: a write that makes no progress for AckTimeout means the server
// (or the path to it) stopped reading, the same silence an overdue ack
// shows. A deadline per chunk rather than per batch keeps a slow but
// moving link from looking dead.
type progressWriter struct{ c *Client }

func (w progressWriter) Write(p []byte) (int, error) {
	n := 0
	for n < len(p) {
		if err := w.c.nc.SetWriteDeadline(time.Now().Add(w.c.o.AckTimeout)); err != nil {
			return n, err
		}
		m, err := w.c.nc.Write(p[n:min(len(p), n+writeBufSize)])
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// writeLoop is the writer goroutine.
func (c *Client) writeLoop() {
	defer c.wg.Done()
	bw := bufio.NewWriterSize(progressWriter{c}, writeBufSize)
	for {
		items, ok := c.q.take()
		if !ok {
			return
		}
		var err error
		size := 0
		for _, it := range items {
			size += len(it.b)
			if err == nil {
				_, err = bw.Write(it.b)
			}
		}
		if err == nil {
			err = bw.Flush()
		}
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				err = fmt.Errorf("%w: a write to %s blocked for %v", ErrHalfOpen, c.desc, c.o.AckTimeout)
			} else {
				err = c.lostErr(err)
			}
			c.fail(err)
			err = c.endErr()
			for _, it := range items {
				if it.sent != nil {
					it.sent(err, 0)
				}
			}
			return
		}
		now := time.Now()
		last := false
		c.mu.Lock()
		c.lastSent = now
		for _, it := range items {
			if it.wait != nil && !it.wait.got {
				it.wait.deadline = now.Add(c.o.AckTimeout)
				c.acks = append(c.acks, it.wait)
			}
			last = last || it.last
		}
		c.compactAcksLocked()
		c.mu.Unlock()
		c.q.release(size)
		for _, it := range items {
			if it.sent != nil {
				it.sent(nil, 0)
			}
		}
		if last {
			c.fail(nil)
			return
		}
	}
}

// compactAcksLocked drops answered waits from c.acks once it has doubled.
// The watchdog drops them from the front, but one slow acknowledgement
// there would let the answered ones behind it pile up for AckTimeout.
func (c *Client) compactAcksLocked() {
	if len(c.acks) < c.acksCompactAt {
		return
	}
	c.acks = slices.DeleteFunc(c.acks, func(w *ackWait) bool { return w.got })
	c.acksCompactAt = max(64, 2*len(c.acks))
}

// outPacket is one packet in the write queue.
type outPacket struct {
	b    []byte
	wait *ackWait          // the acknowledgement it asks for; its deadline starts when written
	sent func(error, byte) // a QoS 0 Publish's done, called once written
	last bool              // DISCONNECT: the connection closes once it is written
}

// writeQueue is the byte-bounded queue between the callers and the writer.
// push blocks while it is full; the bytes count until they are written.
type writeQueue struct {
	mu     sync.Mutex
	cond   sync.Cond
	items  []outPacket
	bytes  int
	closed bool
}

func (q *writeQueue) init() { q.cond.L = &q.mu }

// push queues p, waiting for room unless force. It reports false once the
// queue is closed. A last packet closes the queue behind it.
func (q *writeQueue) push(p outPacket, force bool) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	for !q.closed && !force && q.bytes > 0 && q.bytes+len(p.b) > writeQueueBytes {
		q.cond.Wait()
	}
	return q.add(p)
}

// tryPush queues p only when the queue is empty.
func (q *writeQueue) tryPush(p outPacket) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.bytes == 0 && q.add(p)
}

func (q *writeQueue) add(p outPacket) bool {
	if q.closed {
		return false
	}
	q.items = append(q.items, p)
	q.bytes += len(p.b)
	q.closed = p.last
	q.cond.Broadcast()
	return true
}

// take waits for packets and takes them all; false once the queue is
// closed and empty.
func (q *writeQueue) take() ([]outPacket, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for len(q.items) == 0 && !q.closed {
		q.cond.Wait()
	}
	items := q.items
	q.items = nil
	return items, len(items) > 0
}

// release frees the bytes of written packets.
func (q *writeQueue) release(n int) {
	q.mu.Lock()
	q.bytes -= n
	q.cond.Broadcast()
	q.mu.Unlock()
}

func (q *writeQueue) close() {
	q.mu.Lock()
	q.closed = true
	q.cond.Broadcast()
	q.mu.Unlock()
}

// drain takes what was never written, once the writer has stopped.
func (q *writeQueue) drain() []outPacket {
	q.mu.Lock()
	defer q.mu.Unlock()
	items := q.items
	q.items = nil
	return items
}
