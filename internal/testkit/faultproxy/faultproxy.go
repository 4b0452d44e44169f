// Package faultproxy is a TCP proxy that a test puts between a client and
// its server to make the faults of a real network path. Frozen, it
// forwards nothing in either direction and passes on no close, though it
// keeps accepting connections (which go silent too): to both ends the
// link looks like a mobile link or a NAT that dropped it. Thawed, it
// forwards what it held. Cut, it closes every connection it holds. It can
// also hold back the client's bytes past a count, to stop a conversation
// at an exact packet, and it notes when it accepted each connection, so a
// test sees when a client gave up on a silent link and dialled again.
package faultproxy

import (
	"net"
	"sync"
	"testing"
	"time"

	"github.com/fieldgate/fieldgate/internal/testkit"
)

// dialWait bounds the proxy's dial of its target, before the time scale.
// A target that is down refuses at once; only a hung one waits this long.
const dialWait = 10 * time.Second

// Proxy forwards every connection made to Addr to its target.
type Proxy struct {
	ln     net.Listener
	target string

	mu      sync.Mutex
	cond    sync.Cond // broadcast on every change that may open a gate
	frozen  bool
	upLimit int64 // client→server bytes forwarded before holding the rest; -1: no limit
	upSent  int64 // client→server bytes forwarded
	held    int64 // bytes read but not (yet) forwarded
	closed  bool
	pairs   map[*pair]bool
	accepts []time.Time
	wg      sync.WaitGroup
}

// pair is one proxied connection: the client's end and the server's.
type pair struct {
	down, up net.Conn
	cut      bool // closed by Cut: nothing more passes
}

// New listens on a free 127.0.0.1 port and forwards every connection to
// target until the test ends.
func New(t testing.TB, target string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{ln: ln, target: target, upLimit: -1, pairs: map[*pair]bool{}}
	p.cond.L = &p.mu
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.Close)
	return p
}

// Addr returns the proxy's host:port, for the client to dial.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Freeze stops forwarding, in both directions, on every connection, the
// ones accepted later included.
func (p *Proxy) Freeze() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.frozen = true
}

// Thaw forwards again, what was held first, and lifts HoldUpAfter.
func (p *Proxy) Thaw() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.frozen = false
	p.upLimit = -1
	p.cond.Broadcast()
}

// HoldUpAfter forwards client→server bytes only until UpSent reaches
// total, and holds the rest until Thaw; the other direction flows on.
func (p *Proxy) HoldUpAfter(total int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.upLimit = total
	p.cond.Broadcast()
}

// Cut closes every connection the proxy holds, both ends, dropping what
// it held, and forwards new connections normally: it lifts Freeze and
// HoldUpAfter.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for pr := range p.pairs {
		pr.cut = true
		pr.down.Close()
		pr.up.Close()
	}
	p.frozen = false
	p.upLimit = -1
	p.cond.Broadcast()
}

// UpSent returns the client→server bytes forwarded so far, over all
// connections.
func (p *Proxy) UpSent() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.upSent
}

// Held returns the bytes read from either side and not yet forwarded.
func (p *Proxy) Held() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.held
}

// AcceptedAfter returns how long after since the proxy first accepted a
// connection, if it has.
func (p *Proxy) AcceptedAfter(since time.Time) (time.Duration, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, at := range p.accepts {
		if at.After(since) {
			return at.Sub(since), true
		}
	}
	return 0, false
}

// Close closes the listener and every connection, and waits for the
// proxy's goroutines. The test's cleanup calls it; calling it before is
// harmless.
func (p *Proxy) Close() {
	p.mu.Lock()
	p.closed = true
	p.cond.Broadcast()
	for pr := range p.pairs {
		pr.down.Close()
		pr.up.Close()
	}
	p.mu.Unlock()
	p.ln.Close()
	p.wg.Wait()
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		down, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		p.accepts = append(p.accepts, time.Now())
		p.mu.Unlock()
		up, err := net.DialTimeout("tcp", p.target, testkit.Scale(dialWait))
		if err != nil {
			down.Close() // the target is down: refused, as a direct dial would be
			continue
		}
		pr := &pair{down: down, up: up}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			down.Close()
			up.Close()
			return
		}
		p.pairs[pr] = true
		p.wg.Add(2)
		p.mu.Unlock()
		go p.pump(pr, up, down, true)
		go p.pump(pr, down, up, false)
	}
}

// pump copies src to dst, waiting at the gate before every write. The end
// of either side closes both, once the gate is open: a frozen proxy passes
// on no close either.
func (p *Proxy) pump(pr *pair, dst, src net.Conn, upward bool) {
	defer p.wg.Done()
	var pending int64 // read and not yet forwarded
	defer func() {
		p.mu.Lock()
		p.held -= pending // dropped
		delete(p.pairs, pr)
		p.mu.Unlock()
		dst.Close()
		src.Close()
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		pending = int64(n)
		p.hold(pending)
		for off := 0; off < n; {
			k, ok := p.gate(pr, upward, n-off)
			if !ok {
				return
			}
			if _, err := dst.Write(buf[off : off+k]); err != nil {
				return
			}
			off += k
			pending -= int64(k)
			p.hold(-int64(k))
		}
		if err != nil {
			p.gate(pr, upward, 0)
			return
		}
	}
}

// hold adds n to the bytes held.
func (p *Proxy) hold(n int64) {
	p.mu.Lock()
	p.held += n
	p.mu.Unlock()
}

// gate waits until bytes may go on in the given direction and returns how
// many of n may; false once the proxy is closed or the pair cut.
func (p *Proxy) gate(pr *pair, upward bool, n int) (int, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for {
		if p.closed || pr.cut {
			return 0, false
		}
		if p.frozen {
			p.cond.Wait()
			continue
		}
		if upward && p.upLimit >= 0 && n > 0 {
			room := p.upLimit - p.upSent
			if room <= 0 {
				p.cond.Wait()
				continue
			}
			n = int(min(int64(n), room))
		}
		if upward {
			p.upSent += int64(n)
		}
		return n, true
	}
}
