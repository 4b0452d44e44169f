package broker

import (
	"bufio"
	"encoding/binary"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fieldgate/fieldgate/gateway/broker/auth"
	"github.com/fieldgate/fieldgate/internal/mqttwire"
	"github.com/mochi-mqtt/server/v2/packets"
)

// conn is one network connection (or one in-process client) and its
// outbound queue. The reader goroutine owns the packet loop; the writer
// goroutine owns the socket's write side, the write buffer and the
// outbound topic aliases.
type conn struct {
	b        *Broker
	nc       net.Conn // nil for an in-process client
	local    *Client  // the in-process client, nil for a network one
	listener string
	remote   string

	// Set once CONNECT is accepted, read-only afterwards.
	s           *session
	clientID    string
	user        string
	v5          bool
	window      int    // QoS 1/2 messages we may have in flight to the client
	maxOut      uint32 // largest packet the client accepts, 0 for no limit
	aliasMax    uint16 // topic aliases the client accepts from us
	keepalive   time.Duration
	perms       atomic.Pointer[auth.Permissions] // the client's ACL rules, replaced by a reload (session.applyACL)
	acksWaiting atomic.Int32                     // acknowledgements waiting for a commit
	problemOff  bool                             // the client asked for no reason strings [MQTT-3.1.2-29]
	askedExpiry uint32                           // the session expiry interval CONNECT asked for
	// verifiedBy is the password file that accepted the client's login,
	// nil for a client that logged in otherwise; set before c.user is
	// read through it.
	verifiedBy atomic.Pointer[auth.Passwords]

	// qmu guards the outbound queue.
	qmu      sync.Mutex
	queue    []outItem
	spare    []outItem
	queuedB  int
	closing  bool // no more items; the writer drains what is queued, then closes
	writing  bool // a writer goroutine is running
	finished bool // the writer has closed the connection and done
	greeted  bool // CONNACK is queued: v5 and maxOut are set, a DISCONNECT may follow

	// Reader side.
	rd        *bufio.Reader // borrowed while a packet is being read or bytes are buffered
	one       [1]byte       // the first byte of a packet, read without a buffer
	inAliases []string      // topic aliases the client set, by alias

	// Writer side.
	outAliases map[string]uint16

	done      chan struct{} // closed when the writer has finished
	closeOnce sync.Once
}

// outItem is one packet waiting to be written: a PUBLISH delivery, or the
// bytes of a control packet.
type outItem struct {
	d   delivery
	raw []byte
	pid uint16
	dup bool
}

func (it *outItem) size() int {
	if it.raw != nil {
		return len(it.raw)
	}
	return it.d.msg.size
}

// errClientGone ends a connection the client closed with DISCONNECT.
var errClientGone = errors.New("client disconnected")

// failure is a protocol error the connection ends with: an
// *mqttwire.Error, whose reason code an MQTT 5 client gets in the
// DISCONNECT (or CONNACK) that closes it.
func failure(code byte, format string, args ...any) error {
	return mqttwire.Errorf(code, format, args...)
}

// Reason codes the broker sends (MQTT 5, §2.4).
const (
	rcSuccess              = 0x00
	rcNoSubscriptionExists = 0x11
	rcUnspecified          = 0x80
	rcMalformed            = 0x81
	rcProtocolError        = 0x82
	rcImplementation       = 0x83
	rcUnsupportedVersion   = 0x84
	rcClientIDInvalid      = 0x85
	rcBadUserPass          = 0x86
	rcNotAuthorized        = 0x87
	rcServerBusy           = 0x89
	rcShuttingDown         = 0x8B
	rcBadAuthMethod        = 0x8C
	rcKeepAliveTimeout     = 0x8D
	rcSessionTakenOver     = 0x8E
	rcFilterInvalid        = 0x8F
	rcTopicNameInvalid     = 0x90
	rcPacketIDNotFound     = 0x92
	rcReceiveMaxExceeded   = 0x93
	rcTopicAliasInvalid    = 0x94
	rcPacketTooLarge       = 0x95
	rcQuotaExceeded        = 0x97
	rcSharedNotSupported   = 0x9E
)

func newConn(b *Broker, nc net.Conn, listener string) *conn {
	c := &conn{b: b, nc: nc, listener: listener, done: make(chan struct{})}
	if nc != nil {
		c.remote = nc.RemoteAddr().String()
	}
	return c
}

// enqueueMsg queues a PUBLISH for the writer. QoS 0 messages past the
// client's byte budget are refused (false); QoS 1/2 ones are always taken,
// since the window already bounds them.
func (c *conn) enqueueMsg(d delivery, pid uint16, dup bool) bool {
	c.qmu.Lock()
	if c.closing || (d.qos == 0 && c.queuedB+d.msg.size > c.b.opts.MaxQueuedBytes) {
		c.qmu.Unlock()
		return false
	}
	c.queue = append(c.queue, outItem{d: d, pid: pid, dup: dup})
	c.queuedB += d.msg.size
	start := c.claimWriter()
	c.qmu.Unlock()
	if start {
		go c.run()
	}
	return true
}

// enqueueControl queues the bytes of a control packet.
func (c *conn) enqueueControl(raw []byte) {
	c.qmu.Lock()
	if c.closing {
		c.qmu.Unlock()
		return
	}
	c.queue = append(c.queue, outItem{raw: raw})
	c.queuedB += len(raw)
	start := c.claimWriter()
	c.qmu.Unlock()
	if start {
		go c.run()
	}
}

// claimWriter reports whether the caller must start the writer goroutine:
// none is running and the connection has not finished. The caller holds
// c.qmu. The writer runs only while there is something to write, so an
// idle connection costs one goroutine, not two.
func (c *conn) claimWriter() bool {
	if c.writing || c.finished {
		return false
	}
	c.writing = true
	return true
}

func (c *conn) giveBack(items []outItem, bytes int) {
	clear(items)
	c.qmu.Lock()
	c.queuedB -= bytes
	if cap(items) <= 256 {
		c.spare = items[:0]
	}
	c.qmu.Unlock()
}

// writeBufs lends writers their buffers only while they have something to
// write, so an idle connection holds none.
var writeBufs = sync.Pool{}

func (c *conn) getWriter() *bufio.Writer {
	if w, ok := writeBufs.Get().(*bufio.Writer); ok && w.Size() == c.b.opts.WriteBuffer {
		w.Reset(countingWriter{c})
		return w
	}
	return bufio.NewWriterSize(countingWriter{c}, c.b.opts.WriteBuffer)
}

type countingWriter struct{ c *conn }

func (w countingWriter) Write(p []byte) (int, error) {
	if err := w.c.nc.SetWriteDeadline(time.Now().Add(writeTimeout)); err != nil {
		return 0, err
	}
	n, err := w.c.nc.Write(p)
	w.c.b.stats.bytesSent.Add(int64(n))
	return n, err
}

// writeTimeout bounds one socket write: a peer that has stopped reading
// for this long is gone, and holding its buffers helps nobody.
const writeTimeout = 30 * time.Second

// run is the writer goroutine: it writes (or, for an in-process client,
// hands to the handlers) what is queued until the queue is empty, then
// exits; the next enqueue starts it again. Once the connection is closing
// and everything is written, it closes the socket and done.
func (c *conn) run() {
	var scratch []byte
	for {
		c.qmu.Lock()
		if len(c.queue) == 0 {
			c.writing = false
			fin := c.closing && !c.finished
			c.finished = c.finished || fin
			c.qmu.Unlock()
			if fin {
				if c.nc != nil {
					c.nc.Close()
				}
				close(c.done)
			}
			return
		}
		items := c.queue
		c.queue, c.spare = c.spare[:0], nil
		c.qmu.Unlock()

		// Before giveBack, which clears the items.
		scanning := c.scanning(items)
		if c.local != nil {
			c.giveBack(items, c.local.dispatchAll(items))
			if scanning {
				c.s.pumpRetained()
			}
			continue
		}
		w := c.getWriter()
		n, err := c.writeItems(w, items, &scratch)
		if err == nil {
			err = w.Flush()
		}
		w.Reset(nil)
		writeBufs.Put(w)
		c.giveBack(items, n)
		if err != nil {
			c.nc.Close()
			c.drain()
			continue
		}
		if scanning {
			// Room again in the queue: a retained scan goes on.
			c.s.pumpRetained()
		}
	}
}

// drain empties the queue after a write error so that its bytes are freed.
func (c *conn) drain() {
	c.qmu.Lock()
	c.closing = true
	clear(c.queue)
	c.queue = nil
	c.queuedB = 0
	c.qmu.Unlock()
}

// writeItems writes items to w and returns the queue bytes they held.
func (c *conn) writeItems(w *bufio.Writer, items []outItem, scratch *[]byte) (int, error) {
	n := 0
	for i := range items {
		it := &items[i]
		n += it.size()
		if it.raw != nil {
			if _, err := w.Write(it.raw); err != nil {
				return n, err
			}
			continue
		}
		if it.d.msg == nil {
			continue
		}
		if err := c.writePublish(w, it, scratch); err != nil {
			return n, err
		}
		c.b.stats.msgsSent.Add(1)
	}
	return n, nil
}

// writePublish writes one PUBLISH, from the message's shared bytes when
// this receiver needs nothing of its own.
func (c *conn) writePublish(w *bufio.Writer, it *outItem, scratch *[]byte) error {
	d := &it.d
	var b []byte
	newAlias := false // this packet sets a topic alias
	if c.v5 && (len(d.subIDs) > 0 || c.aliasMax > 0) {
		o := publishOpts{subIDs: d.subIDs}
		if c.aliasMax > 0 {
			o.alias, o.aliasOnly = c.outAlias(d.msg.topic)
			newAlias = o.alias != 0 && !o.aliasOnly
		}
		*scratch = d.msg.encode((*scratch)[:0], true, d.qos, d.retain, o)
		b = *scratch
	} else {
		b = d.msg.encoded(c.v5, d.qos, d.retain)
	}
	if c.maxOut > 0 && uint32(len(b)) > c.maxOut {
		// Too large for the client: discard it as if it had been
		// delivered [MQTT-3.1.2-24] [MQTT-3.1.2-25].
		c.b.stats.dropped.Add(1)
		if newAlias {
			// The client never learns this alias: later messages must
			// not use it. It was the last one assigned, so the next
			// assignment takes its number again.
			delete(c.outAliases, d.msg.topic)
		}
		if d.qos > 0 {
			c.s.discard(it.pid)
		}
		return nil
	}
	h := b[0]
	if it.dup {
		h |= 0x08 // [MQTT-3.3.1-1]
	}
	if err := w.WriteByte(h); err != nil {
		return err
	}
	if d.qos == 0 {
		_, err := w.Write(b[1:])
		return err
	}
	at := pidOffset(b)
	if _, err := w.Write(b[1:at]); err != nil {
		return err
	}
	var pid [2]byte
	binary.BigEndian.PutUint16(pid[:], it.pid)
	if _, err := w.Write(pid[:]); err != nil {
		return err
	}
	_, err := w.Write(b[at+2:])
	return err
}

// outAlias returns the topic alias to send topic with, assigning a new one
// while the client's topic alias maximum allows [MQTT-3.3.2-11]; aliasOnly
// says the client already knows it.
func (c *conn) outAlias(topic string) (alias uint16, aliasOnly bool) {
	if a, ok := c.outAliases[topic]; ok {
		return a, true
	}
	if len(c.outAliases) >= int(c.aliasMax) {
		return 0, false
	}
	if c.outAliases == nil {
		c.outAliases = make(map[string]uint16)
	}
	a := uint16(len(c.outAliases) + 1)
	c.outAliases[topic] = a
	return a, false
}

// noDisconnect asks shutdown to close without a server DISCONNECT.
const noDisconnect = -1

// shutdown stops the connection: a server DISCONNECT with code (MQTT 5
// only, unless code is noDisconnect) is written after what is queued, then
// the socket closes. reason is the text sent with it; empty for the
// code's usual text. It is safe to call more than once, from any goroutine.
func (c *conn) shutdown(code int, reason string) {
	c.closeOnce.Do(func() {
		// Before CONNACK the reader may still be setting v5 and maxOut,
		// and no DISCONNECT may precede CONNACK [MQTT-3.2.0-1].
		c.qmu.Lock()
		greeted := c.greeted
		c.qmu.Unlock()
		if code >= 0 && greeted && c.v5 && c.nc != nil {
			if reason == "" {
				reason = disconnectReason(byte(code))
			}
			c.enqueueControl(disconnectPacket(byte(code), reason, c.maxOut))
		}
		c.qmu.Lock()
		c.closing = true
		start := c.claimWriter()
		c.qmu.Unlock()
		if start {
			go c.run()
		}
		if c.nc == nil {
			return
		}
		// A reader blocked on the socket must wake: the writer closes the
		// socket once its queue is written, and a deadline covers a
		// writer that is stuck.
		_ = c.nc.SetReadDeadline(time.Now())
		go func() {
			select {
			case <-c.done:
			case <-time.After(writeTimeout):
				c.nc.Close()
			}
		}()
	})
}

// readBufs lends readers their buffers from the first byte of a packet
// until the buffer is empty again, so an idle connection holds none.
var readBufs = sync.Pool{}

// releaseReader gives the read buffer back once nothing is buffered.
func (c *conn) releaseReader() {
	if c.rd != nil && c.rd.Buffered() == 0 {
		c.rd.Reset(nil)
		readBufs.Put(c.rd)
		c.rd = nil
	}
}

// readPacket reads one packet: its fixed header byte and body. The body is
// a fresh slice: the codec's strings point into it, and a PUBLISH keeps it
// as its payload.
func (c *conn) readPacket(maxSize int) (packets.FixedHeader, []byte, error) {
	defer c.releaseReader()
	var hb byte
	if c.rd == nil {
		// Idle until now: wait for the first byte without a buffer.
		for {
			n, err := c.nc.Read(c.one[:])
			if n == 1 {
				break
			}
			if err != nil {
				return packets.FixedHeader{}, nil, err
			}
		}
		hb = c.one[0]
		if r, ok := readBufs.Get().(*bufio.Reader); ok && r.Size() == c.b.opts.ReadBuffer {
			r.Reset(c.nc)
			c.rd = r
		} else {
			c.rd = bufio.NewReaderSize(c.nc, c.b.opts.ReadBuffer)
		}
	} else {
		var err error
		if hb, err = c.rd.ReadByte(); err != nil {
			return packets.FixedHeader{}, nil, err
		}
	}
	// [MQTT-3.2.2-15]: a packet above the Maximum Packet Size we
	// announced is a protocol error; mqttwire closes with 0x95.
	fh, size, err := mqttwire.ReadHeader(hb, c.rd, maxSize)
	if err != nil {
		return fh, nil, err
	}
	body, err := mqttwire.ReadBody(c.rd, fh.Remaining, nil)
	if err != nil {
		return fh, nil, err
	}
	c.b.stats.bytesRecv.Add(int64(size))
	return fh, body, nil
}

// decode runs the codec's decoder for pk's type on body (mqttwire.Decode,
// which survives the codec's panics), then checkBody, which applies the
// rules the codec leaves out, under recover too: no input may take the
// broker down.
func decode(pk *packets.Packet, body []byte) (err error) {
	if err := mqttwire.Decode(pk, body); err != nil {
		return err
	}
	defer func() {
		if r := recover(); r != nil {
			err = failure(rcMalformed, "malformed %s packet", mqttwire.PacketName(pk.FixedHeader.Type))
		}
	}()
	return checkBody(pk, body)
}

// encodePacket runs the codec's encoder for pk's type into a fresh slice.
func encodePacket(pk *packets.Packet) []byte {
	b, _ := mqttwire.Encode(pk) // errors only for a packet the broker never builds
	return b
}

func pubrelPacket(pid uint16, v5 bool) []byte { return mqttwire.Ack(packets.Pubrel, pid, 0, v5, "") }

func disconnectPacket(code byte, reason string, maxSize uint32) []byte {
	pk := &packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Disconnect}, ProtocolVersion: 5, ReasonCode: code}
	pk.Properties.ReasonString = reason
	return encodeWithin(pk, maxSize) // [MQTT-3.14.2-3]
}

// encodeWithin encodes pk and, when that takes it past limit (the client's
// Maximum Packet Size, 0 for none), encodes it again without its reason
// string and user properties, which are what a sender leaves out to fit
// [MQTT-3.1.2-24]. The codec's own check counts neither the fixed header
// nor the property length, so it lets a packet a few bytes too large
// through.
func encodeWithin(pk *packets.Packet, limit uint32) []byte {
	b := encodePacket(pk)
	if limit > 0 && uint32(len(b)) > limit {
		pk.Properties.ReasonString, pk.Properties.User = "", nil
		b = encodePacket(pk)
	}
	return b
}

// ackReason returns reason, or "" when the client asked for no problem
// information on acknowledgements [MQTT-3.1.2-29].
func (c *conn) ackReason(reason string) string {
	if c.problemOff {
		return ""
	}
	return reason
}

// disconnectReason is the text a server DISCONNECT carries for code.
func disconnectReason(code byte) string {
	switch code {
	case rcShuttingDown:
		return "server shutting down"
	case rcSessionTakenOver:
		return "another connection took over this client id"
	case rcKeepAliveTimeout:
		return "nothing received within 1.5 times the keep alive"
	case rcQuotaExceeded:
		return "acknowledgements stalled past the broker's limit"
	}
	return ""
}
