package ops

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"syscall"
	"time"
)

// Sources are the gateway's figures, read on every request and every
// history sample. Each function must be cheap and safe to call from many
// goroutines at once, and return slices and maps that it does not change
// afterwards; a nil function reads as nothing to report.
type Sources struct {
	Identity func() Identity    // device name, version, start time
	Broker   func() BrokerStats // the broker's counters
	Clients  func() []Client    // connected network clients
	Sensors  func() []Sensor    // every sensor's health and last values
	Outputs  func() []Output    // every output and whether it is on
	Bridges  func() []Bridge    // every bridge's link and outbox
	Storage  func() StorageStats
	// Ready reports whether the gateway is ready for traffic, and why not:
	// storage open, listeners bound, bridges connected or within their
	// grace period. The gateway decides; nil means always ready.
	Ready func() (ok bool, why string)
	// SetOutput switches an output on or off; nil disables the switch.
	SetOutput func(name string, on bool) error
	// CheckPassword checks a user against the MQTT password file; nil when
	// no password file is configured.
	CheckPassword func(user, password string) bool
	Token         string // ops.token: also allowed to switch outputs; "" for none
}

// Identity names the running gateway.
type Identity struct {
	Name    string    // the {device} level of the gateway's topics
	Version string    // the build's version
	Started time.Time // when the process started
}

// BrokerStats are the broker's counters. The fields mirror broker.Stats, so
// the gateway can convert: func() ops.BrokerStats { return ops.BrokerStats(b.Stats()) }.
// Client, Bridge, Output and Value convert the same way from their
// counterparts; Sensor needs its Values converted one by one.
type BrokerStats struct {
	Started       time.Time
	Connected     int64 // clients connected now, in-process ones included
	Sessions      int   // sessions held, connected or not
	Connections   int64 // connections accepted since start
	MsgsReceived  int64
	MsgsSent      int64
	BytesReceived int64
	BytesSent     int64
	Dropped       int64 // messages dropped for a full or expired queue
	Refused       int64 // publishes refused because a queue that never drops was full
	Withheld      int64 // deliveries withheld because the subscriber's user may not read the topic
	Subscriptions int
	Retained      int

	PersistentSessions int              // sessions counted against broker.max_persistent_sessions
	RetainedCounted    int              // retained messages counted against broker.max_retained_messages
	RetainedBytes      int64            // their bytes, as broker.max_retained_bytes counts them
	Refusals           map[string]int64 // what the broker's bounds refused, by bound
}

// Client is one connected network client; the fields mirror broker.ClientInfo.
type Client struct {
	ID       string
	User     string
	Listener string
	Remote   string
	V5       bool // MQTT 5; false is 3.1.1
}

// Sensor is one sensor's health, counters and last values; the fields
// mirror sensors.Stats.
type Sensor struct {
	Name, Kind string
	OK         bool      // the last reading succeeded
	Since      time.Time // when OK last changed
	LastError  string
	Reads      uint64            // readings published
	Failures   map[string]uint64 // failed readings by reason
	Values     []Value
	LastRead   time.Time
}

// Value is one quantity's last value; the fields mirror sensors.Value.
type Value struct {
	Quantity string
	Unit     string
	Value    float64
}

// Output is one output, such as a relay; the fields mirror sensors.OutputState.
type Output struct {
	Name string
	On   bool
}

// Bridge is one bridge's link and outbox; the fields mirror bridge.Stats.
type Bridge struct {
	Name         string
	State        string // connecting, connected, down or stopped
	Since        time.Time
	LastError    string
	Protocol     byte  // 5 or 4 once connected
	Depth        int   // messages in the outbox
	Bytes        int64 // bytes in the outbox
	OldestAge    time.Duration
	Sent         uint64            // messages handed to the link
	Acked        uint64            // acknowledged by the upstream
	Inbound      uint64            // upstream messages published locally
	Reconnects   uint64            // connections made
	Dropped      map[string]uint64 // outbox messages dropped, by reason
	Window       int               // in-flight limit of the current link
	PeakInflight int
	Resumed      uint64
}

// StorageStats describes the state database.
type StorageStats struct {
	FileBytes  int64         // the file's size
	Commits    int64         // transactions, each one fsync
	CommitTime time.Duration // total time spent in them
	Failures   int64         // transactions that failed
	LazyLost   int64         // lazy batches lost to failed transactions
}

// Limits of the HTTP server. A scraper, a phone and an operator's curl are
// the expected clients; everything else only needs to be bounded.
const (
	// readHeaderTimeout stops a client that opens a connection and sends
	// its headers a byte at a time.
	readHeaderTimeout = 5 * time.Second
	// readTimeout covers the largest body we accept, a switch form.
	readTimeout = 10 * time.Second
	// writeTimeout bounds a request's whole answer; a bcrypt check on a Pi
	// Zero takes a fraction of a second, a status page a few milliseconds.
	writeTimeout = 30 * time.Second
	idleTimeout  = 60 * time.Second
	// maxHeaderBytes fits a browser's headers with basic auth and cookies
	// for other services on the same host.
	maxHeaderBytes = 16 << 10
	// maxConns caps open connections: each costs a goroutine and buffers,
	// and the endpoint needs a few at a time.
	maxConns = 32
	// maxFormBytes bounds a switch request's body.
	maxFormBytes = 4 << 10
)

// Server is the ops HTTP endpoint: /healthz, /readyz, /metrics, the status
// page at / and the output switch at /outputs/{name}.
type Server struct {
	addr string
	src  Sources
	log  *slog.Logger
	now  func() time.Time // the clock for ages and uptime; tests replace it
	hist *history
	auth chan struct{} // bounds concurrent password checks

	mu       sync.Mutex
	ln       net.Listener
	srv      *http.Server
	loopback bool // the listener is on a loopback address
	stop     chan struct{}
	done     sync.WaitGroup
}

// New returns a server for addr (host:port) over src; Start binds it.
func New(addr string, src Sources, log *slog.Logger) *Server {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Server{
		addr: addr, src: src, log: log, now: time.Now, hist: newHistory(),
		// Two checks at once keep bcrypt from taking every core of a Pi
		// when someone guesses passwords.
		auth: make(chan struct{}, 2),
	}
}

// ErrStarted is returned by Start on a server started before: a Server
// serves once, from Start to Shutdown.
var ErrStarted = errors.New("ops: server already started")

// Start binds the address and serves in the background. It samples the
// sensors for the status page's history until Shutdown.
func (s *Server) Start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ln != nil {
		return ErrStarted
	}
	ln, err := net.Listen("tcp", s.addr)
	if err != nil {
		if errors.Is(err, syscall.EADDRINUSE) {
			return fmt.Errorf("ops: ops.address %s: the port is already in use by another process; stop it or choose another port: %w", s.addr, err)
		}
		return fmt.Errorf("ops: ops.address %s: %w", s.addr, err)
	}
	if a, ok := ln.Addr().(*net.TCPAddr); ok {
		s.loopback = a.IP.IsLoopback()
	}
	s.ln = ln
	s.srv = &http.Server{
		Handler:           s.handler(),
		ReadHeaderTimeout: readHeaderTimeout,
		ReadTimeout:       readTimeout,
		WriteTimeout:      writeTimeout,
		IdleTimeout:       idleTimeout,
		MaxHeaderBytes:    maxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
	}
	s.stop = make(chan struct{})
	srv, stop := s.srv, s.stop
	s.done.Add(2)
	go func() {
		defer s.done.Done()
		if err := srv.Serve(newLimitListener(ln, maxConns)); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Error("ops endpoint stopped serving", "addr", s.addr, "err", err)
		}
	}()
	go func() {
		defer s.done.Done()
		s.sampleLoop(stop)
	}()
	s.log.Info("ops endpoint listening", "addr", ln.Addr().String(), "switch", s.switchMode())
	return nil
}

// Addr returns the bound address, or nil before Start.
func (s *Server) Addr() net.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ln == nil {
		return nil
	}
	return s.ln.Addr()
}

// Shutdown stops accepting, lets requests in progress finish until ctx is
// done, and stops the history sampler. It returns ctx's error if requests
// were cut short.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	srv, stop := s.srv, s.stop
	s.srv, s.stop = nil, nil
	s.mu.Unlock()
	if srv == nil {
		return nil
	}
	close(stop)
	err := srv.Shutdown(ctx)
	if err != nil {
		srv.Close()
	}
	s.done.Wait()
	return err
}

// handler routes the endpoints. Method-qualified patterns answer other
// methods with 405.
func (s *Server) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", s.healthz)
	mux.HandleFunc("GET /readyz", s.readyz)
	mux.HandleFunc("GET /metrics", s.metrics)
	mux.HandleFunc("GET /{$}", s.status)
	// The standard library's check turns away a POST that a browser marks
	// as cross-site (Sec-Fetch-Site, or an Origin unlike Host), so a page
	// elsewhere cannot ride on credentials the browser has cached for us.
	csrf := http.NewCrossOriginProtection()
	mux.Handle("POST /outputs/{name}", csrf.Handler(http.HandlerFunc(s.switchOutput)))
	return mux
}

func (s *Server) healthz(w http.ResponseWriter, r *http.Request) {
	plain(w, http.StatusOK, "ok\n")
}

func (s *Server) readyz(w http.ResponseWriter, r *http.Request) {
	if ok, why := s.ready(); !ok {
		plain(w, http.StatusServiceUnavailable, "not ready: "+why+"\n")
		return
	}
	plain(w, http.StatusOK, "ready\n")
}

func (s *Server) ready() (bool, string) {
	if s.src.Ready == nil {
		return true, ""
	}
	return s.src.Ready()
}

// plain writes a short text answer that no cache should keep.
func plain(w http.ResponseWriter, code int, text string) {
	h := w.Header()
	h.Set("Content-Type", "text/plain; charset=utf-8")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(code)
	_, _ = w.Write([]byte(text))
}

// call returns f's result, or the zero value when f is nil.
func call[T any](f func() T) T {
	if f == nil {
		var zero T
		return zero
	}
	return f()
}

// limitListener holds Accept while n connections are open.
type limitListener struct {
	net.Listener
	slots chan struct{}
}

func newLimitListener(ln net.Listener, n int) net.Listener {
	return &limitListener{Listener: ln, slots: make(chan struct{}, n)}
}

// Accept waits for a free slot, then for a connection. Close of the
// listener ends the wait for a connection; a wait for a slot ends when a
// connection closes, which Shutdown brings about.
func (l *limitListener) Accept() (net.Conn, error) {
	l.slots <- struct{}{}
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.slots
		return nil, err
	}
	return &limitConn{Conn: c, release: func() { <-l.slots }}, nil
}

// limitConn gives its slot back once, on the first Close.
type limitConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}
