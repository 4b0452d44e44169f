package reliability

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"time"

	"github.com/fieldgate/fieldgate/internal/mqttwire"
	"github.com/mochi-mqtt/server/v2/packets"
)

// slowStamped reads MQTT packets from a TCP connection together with the
// time the kernel received the bytes that completed each (SO_TIMESTAMPNS).
// A subscriber's latency then splits in two: up to its socket (the
// publisher's write, the gateway, loopback) and its own (being scheduled
// to read), which tells a slow gateway from a slow test client.
type slowStamped struct {
	rc     syscall.RawConn
	buf    []byte      // received and not yet returned as packets
	chunks []slowChunk // when buf's bytes arrived, in order
	tmp    []byte
	oob    []byte
}

// slowChunk says that buf's bytes before end arrived at at, or earlier.
type slowChunk struct {
	end int
	at  time.Time
}

// slowNewStamped turns on receive timestamps on nc, whose client must
// have nothing buffered.
func slowNewStamped(c *client) (*slowStamped, error) {
	if c.r.Buffered() > 0 {
		return nil, fmt.Errorf("%s: %d bytes already buffered", c.id, c.r.Buffered())
	}
	rc, err := c.nc.(*net.TCPConn).SyscallConn()
	if err != nil {
		return nil, err
	}
	// Reads wait as long as they must: the subscriber is stopped by
	// closing its connection.
	if err := c.nc.SetReadDeadline(time.Time{}); err != nil {
		return nil, err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_TIMESTAMPNS, 1)
	}); err != nil {
		return nil, err
	}
	if serr != nil {
		return nil, fmt.Errorf("SO_TIMESTAMPNS: %w", serr)
	}
	return &slowStamped{rc: rc, tmp: make([]byte, 16<<10), oob: make([]byte, syscall.CmsgSpace(16))}, nil
}

// read returns the next packet and when its last byte reached the socket.
func (r *slowStamped) read() (*packets.Packet, time.Time, error) {
	for {
		if pk, at, ok, err := r.next(); ok || err != nil {
			return pk, at, err
		}
		if err := r.recv(); err != nil {
			return nil, time.Time{}, err
		}
	}
}

// next takes one whole packet off buf, if there is one.
func (r *slowStamped) next() (*packets.Packet, time.Time, bool, error) {
	if len(r.buf) == 0 {
		return nil, time.Time{}, false, nil
	}
	fh, total, err := mqttwire.ReadHeader(r.buf[0], bytes.NewReader(r.buf[1:]), 0)
	switch {
	case errors.Is(err, io.ErrUnexpectedEOF):
		return nil, time.Time{}, false, nil // the remaining length is still coming
	case err != nil:
		return nil, time.Time{}, false, fmt.Errorf("from the broker: %w", err)
	case len(r.buf) < total:
		return nil, time.Time{}, false, nil
	}
	var at time.Time
	for _, c := range r.chunks {
		if c.end >= total {
			at = c.at
			break
		}
	}
	pk, err := decodeFromBroker(fh, bytes.Clone(r.buf[total-fh.Remaining:total]))
	if err != nil {
		return nil, at, false, err
	}
	r.buf = r.buf[:copy(r.buf, r.buf[total:])]
	k := 0
	for _, c := range r.chunks {
		if c.end > total {
			r.chunks[k] = slowChunk{c.end - total, c.at}
			k++
		}
	}
	r.chunks = r.chunks[:k]
	return pk, at, true, nil
}

// recv appends what the socket has to buf, with its arrival time.
func (r *slowStamped) recv() error {
	var n, oobn int
	var rerr error
	err := r.rc.Read(func(fd uintptr) bool {
		n, oobn, _, _, rerr = syscall.Recvmsg(int(fd), r.tmp, r.oob, 0)
		return rerr != syscall.EAGAIN
	})
	if err != nil {
		return err
	}
	if rerr != nil {
		return rerr
	}
	if n == 0 {
		return io.EOF
	}
	at := time.Now()
	msgs, err := syscall.ParseSocketControlMessage(r.oob[:oobn])
	if err != nil {
		return err
	}
	for _, m := range msgs {
		if m.Header.Level != syscall.SOL_SOCKET || m.Header.Type != syscall.SCM_TIMESTAMPNS {
			continue
		}
		// A struct timespec: two 64-bit fields, or two 32-bit ones on
		// 32-bit ARM.
		switch len(m.Data) {
		case 16:
			at = time.Unix(int64(binary.NativeEndian.Uint64(m.Data)), int64(binary.NativeEndian.Uint64(m.Data[8:])))
		case 8:
			at = time.Unix(int64(int32(binary.NativeEndian.Uint32(m.Data))), int64(binary.NativeEndian.Uint32(m.Data[4:])))
		}
	}
	r.buf = append(r.buf, r.tmp[:n]...)
	r.chunks = append(r.chunks, slowChunk{len(r.buf), at})
	return nil
}
