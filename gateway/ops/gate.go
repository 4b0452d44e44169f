package ops

import (
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// The connection gate.
//
// Every connection is accepted at once, so that nothing waits in the
// kernel's backlog behind connections that hold their slots. One within
// ops.max_conns and its source's ops.max_conns_per_source is served in
// full. One past either limit goes to the probe lane instead: a second,
// tightly bounded server that answers /healthz and /readyz as usual and
// everything else with 503, one request per connection. So a host that
// opens many idle keep-alive connections holds at most its own share of
// the slots, other hosts keep theirs, and a health probe is answered even
// when every slot is taken.

// Bounds of the probe lane. A probe sends its request at once, so two
// seconds for the request's headers only cut off a connection that says
// nothing. 64 connections at a time, each gone within those two seconds
// or with its answer, cost at most a few hundred KiB; past them a
// connection is closed at once.
const (
	laneConns       = 64
	laneReadTimeout = 2 * time.Second
	laneWrite       = 5 * time.Second
)

// gateCounts counts the connections the limits turned away from a slot.
type gateCounts struct {
	perSource atomic.Int64 // over ops.max_conns_per_source: to the probe lane
	total     atomic.Int64 // over ops.max_conns: to the probe lane
	laneFull  atomic.Int64 // the probe lane was full too: closed at once
}

// gate is the main server's listener: it hands on the connections within
// the limits and sends the others to the lane.
type gate struct {
	net.Listener
	max, perSource int
	lane           *lane
	counts         *gateCounts

	mu    sync.Mutex
	open  int
	bySrc map[string]int
}

func newGate(ln net.Listener, maxConns, perSource int, counts *gateCounts) *gate {
	return &gate{
		Listener: ln, max: maxConns, perSource: perSource, counts: counts,
		lane:  newLane(ln.Addr()),
		bySrc: map[string]int{},
	}
}

// Accept returns the next connection within the limits; those past them
// go to the lane meanwhile.
func (g *gate) Accept() (net.Conn, error) {
	for {
		c, err := g.Listener.Accept()
		if err != nil {
			return nil, err
		}
		src := source(c.RemoteAddr())
		g.mu.Lock()
		var over *atomic.Int64
		switch {
		case g.open >= g.max:
			over = &g.counts.total
		case g.bySrc[src] >= g.perSource:
			over = &g.counts.perSource
		default:
			g.open++
			g.bySrc[src]++
		}
		g.mu.Unlock()
		if over == nil {
			return &slotConn{Conn: c, release: func() { g.release(src) }}, nil
		}
		over.Add(1)
		if !g.lane.offer(c) {
			g.counts.laneFull.Add(1)
		}
	}
}

func (g *gate) release(src string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.open--
	if g.bySrc[src]--; g.bySrc[src] <= 0 {
		delete(g.bySrc, src)
	}
}

// source is what the per-source limit counts by: the peer's IP address.
func source(a net.Addr) string {
	if t, ok := a.(*net.TCPAddr); ok {
		return t.IP.String()
	}
	if h, _, err := net.SplitHostPort(a.String()); err == nil {
		return h
	}
	return a.String()
}

// slotConn gives its slot back once, on the first Close.
type slotConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *slotConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}

// lane is the probe lane's listener: the gate offers it connections, its
// server accepts them.
type lane struct {
	addr  net.Addr
	conns chan net.Conn // offered, not yet accepted
	slots chan struct{} // connections in the lane, accepted or not
	done  chan struct{}
	once  sync.Once
}

func newLane(addr net.Addr) *lane {
	return &lane{
		addr:  addr,
		conns: make(chan net.Conn, laneConns),
		slots: make(chan struct{}, laneConns),
		done:  make(chan struct{}),
	}
}

// offer queues c for the lane's server, or closes it when the lane is
// full or closed and reports false.
func (l *lane) offer(c net.Conn) bool {
	select {
	case l.slots <- struct{}{}:
	default:
		c.Close()
		return false
	}
	sc := &slotConn{Conn: c, release: func() { <-l.slots }}
	// conns has room for every slot: this send does not wait.
	select {
	case l.conns <- sc:
		return true
	case <-l.done:
		sc.Close()
		return false
	}
}

func (l *lane) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

// Close stops the lane and closes what waits in it.
func (l *lane) Close() error {
	l.once.Do(func() {
		close(l.done)
		for {
			select {
			case c := <-l.conns:
				c.Close()
			default:
				return
			}
		}
	})
	return nil
}

func (l *lane) Addr() net.Addr { return l.addr }

// laneServer serves the probe lane: /healthz and /readyz, anything else
// 503, each connection closed after its one answer.
func (s *Server) laneServer() *http.Server {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", s.healthz)
	mux.HandleFunc("GET /readyz", s.readyz)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Retry-After", "1")
		plain(w, http.StatusServiceUnavailable, "too many connections to the ops endpoint, from your address or in all; close idle ones and try again\n")
	})
	srv := &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: laneReadTimeout,
		ReadTimeout:       laneReadTimeout,
		WriteTimeout:      laneWrite,
		MaxHeaderBytes:    maxHeaderBytes,
		ErrorLog:          s.srv.ErrorLog,
	}
	srv.SetKeepAlivesEnabled(false)
	return srv
}
