package brokerbench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"
)

// maxProblems is how many failures of one run are reported word for word;
// the rest are counted.
const maxProblems = 3

// role is a kind of connection the generator opens: the letter in its
// client id and its buffer sizes.
type role struct {
	id      byte
	buf     int // bytes of each bufio buffer, read and write
	sendBuf int // bytes of the socket's send buffer; 0 leaves it to the kernel
}

var (
	// Publishers batch: 32 KiB is several hundred messages per write at
	// QoS 0. Their socket buffer is capped because the kernel would grow it
	// to megabytes, a backlog of many seconds in front of a slow broker that
	// would make sent/s and delivered-% meaningless.
	publisher  = role{id: 'p', buf: 32 << 10, sendBuf: 64 << 10}
	subscriber = role{id: 's', buf: 32 << 10}
	// Idle connections only ever read CONNACK and SUBACK.
	idler   = role{id: 'i', buf: 512}
	monitor = role{id: 'm'}
)

// fleet owns the connections and goroutines of one scenario run. stop
// closes every connection and waits for every goroutine the fleet started;
// failures before stop are kept for the report.
type fleet struct {
	cfg      *Config
	ctx      context.Context
	cancel   context.CancelFunc
	prefix   string // client id prefix, fresh for every run so no session is taken over
	stopping atomic.Bool
	wg       sync.WaitGroup

	mu       sync.Mutex // guards conns, problems and failures
	conns    []*Conn
	problems []string
	failures int
}

func newFleet(ctx context.Context, cfg *Config) *fleet {
	ctx, cancel := context.WithCancel(ctx)
	return &fleet{cfg: cfg, ctx: ctx, cancel: cancel, prefix: fmt.Sprintf("bb%06x", rand.Uint32()&0xffffff)}
}

// dial opens connection i of role r. Its client id is at most 23 bytes,
// which MQTT 3.1.1 servers must accept [MQTT-3.1.3-5].
func (f *fleet) dial(r role, i int) (*Conn, error) {
	c, err := Dial(f.ctx, f.cfg.Addr, Options{
		ClientID:    fmt.Sprintf("%s%c%d", f.prefix, r.id, i),
		Keepalive:   f.cfg.Keepalive,
		ReadBuffer:  r.buf,
		WriteBuffer: r.buf,
		SendBuffer:  r.sendBuf,
	})
	if err != nil {
		return nil, err
	}
	f.mu.Lock()
	f.conns = append(f.conns, c)
	f.mu.Unlock()
	return c, nil
}

// dialMany opens n connections of role r and runs setup on each, at most
// cfg.Dials at a time so the broker's accept backlog never overflows. It
// returns the connections in index order, or the first failure.
func (f *fleet) dialMany(r role, n int, setup func(i int, c *Conn) error) ([]*Conn, error) {
	conns := make([]*Conn, n)
	var (
		next     atomic.Int64
		failed   atomic.Bool
		firstErr error
		once     sync.Once
		wg       sync.WaitGroup
	)
	for range min(max(f.cfg.Dials, 1), n) {
		wg.Go(func() {
			for !failed.Load() && f.ctx.Err() == nil {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				c, err := f.dial(r, i)
				if err == nil && setup != nil {
					err = setup(i, c)
				}
				if err != nil {
					once.Do(func() { firstErr = fmt.Errorf("connection %d of %d: %w", i+1, n, err) })
					failed.Store(true)
					return
				}
				conns[i] = c
			}
		})
	}
	wg.Wait()
	if firstErr == nil && f.ctx.Err() != nil {
		firstErr = f.ctx.Err()
	}
	return conns, firstErr
}

// serve reads c on a goroutine of its own until the connection closes,
// handing every packet to handle.
func (f *fleet) serve(c *Conn, handle func(*packets.Packet) error) {
	f.wg.Go(func() {
		var pk packets.Packet
		for {
			err := c.Read(&pk)
			if err == nil {
				err = handle(&pk)
			}
			if err != nil {
				f.fail(err)
				return
			}
		}
	})
}

// spawn runs fn on a goroutine the fleet waits for in stop.
func (f *fleet) spawn(fn func()) { f.wg.Go(fn) }

// fail records a failure, unless the fleet is stopping, when closed
// connections are expected to fail.
func (f *fleet) fail(err error) {
	if f.stopping.Load() {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failures++
	if len(f.problems) < maxProblems {
		f.problems = append(f.problems, err.Error())
	}
}

// notes describes the failures recorded so far, for the report.
func (f *fleet) notes() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := slices.Clone(f.problems)
	if f.failures > len(f.problems) {
		out = append(out, fmt.Sprintf("... and %d more failures", f.failures-len(f.problems)))
	}
	return out
}

// keepAlive pings every connection of the fleet each half keepalive until
// stop, so that a broker does not drop connections that only receive or
// sit idle [MQTT-3.1.2-24].
func (f *fleet) keepAlive() {
	if f.cfg.Keepalive <= 0 {
		return
	}
	f.wg.Go(func() {
		t := time.NewTicker(f.cfg.Keepalive / 2)
		defer t.Stop()
		for {
			select {
			case <-f.ctx.Done():
				return
			case <-t.C:
			}
			f.mu.Lock()
			conns := slices.Clone(f.conns)
			f.mu.Unlock()
			for _, c := range conns {
				if err := c.Ping(); err != nil {
					f.fail(fmt.Errorf("PINGREQ: %w", err))
				}
			}
		}
	})
}

// stop cancels the run, closes every connection and waits for every
// goroutine the fleet started.
func (f *fleet) stop() {
	f.stopping.Store(true)
	f.cancel()
	f.mu.Lock()
	conns := f.conns
	f.conns = nil
	f.mu.Unlock()
	deadline := time.Now().Add(closeGrace)
	for _, c := range conns {
		_ = c.closeBy(deadline)
	}
	f.wg.Wait()
}

// sleep waits for d or until ctx ends, reporting whether d passed.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
