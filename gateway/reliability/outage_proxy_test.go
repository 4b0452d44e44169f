package reliability

import (
	"net"
	"sync"
	"testing"
	"time"
)

// outageProxy is a TCP proxy between the bridge and the upstream that can
// go silent: frozen, it forwards nothing in either direction and passes
// on no close, though it keeps accepting connections (which go silent
// too), so that to both ends the path looks like a mobile link or a NAT
// that dropped it. Thawed, it forwards what it held; cut, it closes every
// connection it holds. It notes when it accepted each connection, so that
// a test sees when the bridge gave up on a silent link and dialled again.
type outageProxy struct {
	ln     net.Listener
	target string

	mu      sync.Mutex
	cond    sync.Cond
	frozen  bool
	closed  bool
	pairs   map[*outagePair]bool
	accepts []time.Time
	wg      sync.WaitGroup
}

// outagePair is one proxied connection: the bridge's end and the
// upstream's.
type outagePair struct {
	down, up net.Conn
	cut      bool // closed by cut: nothing more passes
}

// newOutageProxy listens on a free loopback port and forwards to target
// until the test ends.
func newOutageProxy(t *testing.T, target string) *outageProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &outageProxy{ln: ln, target: target, pairs: map[*outagePair]bool{}}
	p.cond.L = &p.mu
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

func (p *outageProxy) addr() string { return p.ln.Addr().String() }

// freeze stops all forwarding and returns when it did.
func (p *outageProxy) freeze() time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.frozen = true
	return time.Now()
}

// thaw forwards again, what was held first.
func (p *outageProxy) thaw() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.frozen = false
	p.cond.Broadcast()
}

// cut closes every connection the proxy holds, both ends, dropping what
// it held, and forwards new connections normally.
func (p *outageProxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for pr := range p.pairs {
		pr.cut = true
		pr.down.Close()
		pr.up.Close()
	}
	p.frozen = false
	p.cond.Broadcast()
}

// acceptedAfter returns how long after since the proxy first accepted a
// connection, if it has.
func (p *outageProxy) acceptedAfter(since time.Time) (time.Duration, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, at := range p.accepts {
		if at.After(since) {
			return at.Sub(since), true
		}
	}
	return 0, false
}

// close closes the listener and every connection, and waits for the
// proxy's goroutines.
func (p *outageProxy) close() {
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

func (p *outageProxy) accept() {
	defer p.wg.Done()
	for {
		down, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		p.accepts = append(p.accepts, time.Now())
		p.mu.Unlock()
		up, err := net.DialTimeout("tcp", p.target, ioTimeout)
		if err != nil {
			down.Close() // the upstream is down: refused, as a direct dial would be
			continue
		}
		pr := &outagePair{down: down, up: up}
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
		go p.pump(pr, up, down)
		go p.pump(pr, down, up)
	}
}

// pump copies src to dst, waiting at the gate before every write; the end
// of either side closes both, once the gate is open.
func (p *outageProxy) pump(pr *outagePair, dst, src net.Conn) {
	defer p.wg.Done()
	defer func() {
		p.mu.Lock()
		delete(p.pairs, pr)
		p.mu.Unlock()
		dst.Close()
		src.Close()
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if !p.gate(pr) {
				return
			}
			if _, err := dst.Write(buf[:n]); err != nil {
				return
			}
		}
		if err != nil {
			p.gate(pr)
			return
		}
	}
}

// gate waits while the proxy is frozen; false once the proxy or the pair
// is closed.
func (p *outageProxy) gate(pr *outagePair) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for p.frozen && !p.closed && !pr.cut {
		p.cond.Wait()
	}
	return !p.closed && !pr.cut
}
