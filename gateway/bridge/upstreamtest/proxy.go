package upstreamtest

import (
	"net"
	"sync"
	"testing"
)

// Proxy is a TCP proxy between a client and target. Freeze makes it stop
// forwarding in both directions without closing anything: to both ends
// the link goes silent, as when a mobile link or a NAT drops it.
type Proxy struct {
	t      testing.TB
	ln     net.Listener
	target string

	mu      sync.Mutex
	cond    sync.Cond
	frozen  bool
	upLimit int64 // client→server bytes forwarded before holding the rest; -1: no limit
	upSent  int64 // client→server bytes forwarded
	held    int64 // bytes read but not forwarded
	closed  bool
	conns   []net.Conn
	wg      sync.WaitGroup
}

// NewProxy listens on a free 127.0.0.1 port and forwards every connection
// to target until Close, which the test's cleanup calls.
func NewProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{t: t, ln: ln, target: target, upLimit: -1}
	p.cond.L = &p.mu
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.Close)
	return p
}

// Addr returns the proxy's host:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Freeze stops forwarding, in both directions, on every connection.
func (p *Proxy) Freeze() {
	p.mu.Lock()
	p.frozen = true
	p.mu.Unlock()
}

// Thaw forwards again, what was held first, and lifts HoldUpAfter.
func (p *Proxy) Thaw() {
	p.mu.Lock()
	p.frozen = false
	p.upLimit = -1
	p.cond.Broadcast()
	p.mu.Unlock()
}

// HoldUpAfter forwards client→server bytes only until UpSent reaches
// total, and holds the rest until Thaw; the other direction flows on.
func (p *Proxy) HoldUpAfter(total int64) {
	p.mu.Lock()
	p.upLimit = total
	p.cond.Broadcast()
	p.mu.Unlock()
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

// Close closes the listener and every connection, and waits for the
// proxy's goroutines.
func (p *Proxy) Close() {
	p.mu.Lock()
	p.closed = true
	p.cond.Broadcast()
	conns := p.conns
	p.conns = nil
	p.mu.Unlock()
	p.ln.Close()
	for _, c := range conns {
		c.Close()
	}
	p.wg.Wait()
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		down, err := p.ln.Accept()
		if err != nil {
			return
		}
		up, err := net.DialTimeout("tcp", p.target, Wait)
		if err != nil {
			down.Close()
			continue
		}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			down.Close()
			up.Close()
			return
		}
		p.conns = append(p.conns, down, up)
		p.wg.Add(2)
		p.mu.Unlock()
		go p.pump(up, down, true)
		go p.pump(down, up, false)
	}
}

// pump copies src to dst, waiting at the gate before every write. An end
// of either side closes both, once the gate is open: a frozen proxy passes
// on no close either.
func (p *Proxy) pump(dst, src net.Conn, upward bool) {
	defer p.wg.Done()
	defer func() {
		dst.Close()
		src.Close()
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		p.hold(n)
		for off := 0; off < n; {
			k, ok := p.gate(upward, n-off)
			if !ok {
				return
			}
			if _, err := dst.Write(buf[off : off+k]); err != nil {
				return
			}
			off += k
			p.hold(-k)
		}
		if err != nil {
			p.gate(upward, 0)
			return
		}
	}
}

func (p *Proxy) hold(n int) {
	p.mu.Lock()
	p.held += int64(n)
	p.mu.Unlock()
}

// gate waits until bytes may go on in the given direction and returns how
// many of n may; false once the proxy is closed.
func (p *Proxy) gate(upward bool, n int) (int, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for {
		if p.closed {
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
