package ops

import (
	"cmp"
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
	// grace period, state file writes succeeding. The gateway decides; nil
	// means always ready.
	Ready func() (ok bool, why string)
	// SetOutput switches an output on or off; nil disables the switch.
	SetOutput func(name string, on bool) error
	// CheckPassword checks a user against the MQTT password file, for a
	// request from remote (http.Request.RemoteAddr), whose failures count
	// as an MQTT login's do; nil when no password file is configured.
	CheckPassword func(remote, user, password string) bool
	// MaySwitch reports whether an MQTT user who logged in may switch an
	// output: the publish permission the broker's ACL gives that user on
	// the output's set topic. nil lets every user switch.
	MaySwitch func(user, output string) bool
	Token     string // ops.token: also allowed to switch outputs; "" for none
	// DeadLetters returns up to limit (<= 0: as many as the bridge
	// lists at once) of a bridge's newest dead letters, oldest first;
	// RetryDeadLetters moves those named (none: all) back to its outbox
	// and DropDeadLetters deletes them, each saying how many. Their
	// errors wrap ErrNotFound for a bridge or dead letter that does not
	// exist. nil: the gateway keeps none.
	DeadLetters      func(bridge string, limit int) ([]DeadLetter, error)
	RetryDeadLetters func(bridge string, seqs []uint64) (int, error)
	DropDeadLetters  func(bridge string, seqs []uint64) (int, error)
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
	OriginRefused int64 // WebSocket upgrades refused because a page of another origin asked
	Subscriptions int
	Retained      int

	PersistentSessions int              // sessions counted against broker.max_persistent_sessions
	RetainedCounted    int              // retained messages counted against broker.max_retained_messages
	RetainedBytes      int64            // their bytes, as broker.max_retained_bytes counts them
	Refusals           map[string]int64 // what the broker's bounds refused, by bound
	LoginsRefused      map[string]int64 // logins refused, by reason: password, limited, queue_full, queue_timeout
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
	// DeadLetters are the messages the upstream kept refusing, kept aside
	// in the state file, and DeadLetterBytes their bytes.
	DeadLetters     int
	DeadLetterBytes int64
	DeadLettered    uint64 // moved to the dead letters since the start
	Failing         int    // connection attempts in a row that delivered nothing
	QoSLimit        byte   // the highest QoS sent upstream, as the server's Maximum QoS or a refusal lowered it
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
	// maxHeaderBytes fits a browser's headers with basic auth and cookies
	// for other services on the same host.
	maxHeaderBytes = 16 << 10
	// maxFormBytes bounds a switch request's body (a dead-letter
	// request's is maxSeqFormBytes).
	maxFormBytes = 4 << 10
)

// Server is the ops HTTP endpoint: /healthz, /readyz, /metrics, the status
// page at /, the output switch at /outputs/{name} and the bridges' dead
// letters at /bridges/{name}/dead-letters.
type Server struct {
	addr string
	cfg  Config // the connection bounds
	src  Sources
	log  *slog.Logger
	now  func() time.Time // the clock for ages and uptime; tests replace it
	hist *history
	auth chan struct{} // bounds concurrent password checks

	gated   gateCounts    // connections the limits sent to the probe lane
	refused refusedCounts // requests refused for their credentials or permissions

	mu       sync.Mutex
	ln       net.Listener
	srv      *http.Server
	laneSrv  *http.Server // the probe lane's server (see gate.go)
	loopback bool         // the listener is on a loopback address
	stop     chan struct{}
	done     sync.WaitGroup
}

// New returns a server for addr (host:port) over src, with the default
// connection bounds; Start binds it.
func New(addr string, src Sources, log *slog.Logger) *Server {
	cfg := DefaultConfig()
	cfg.Address = addr
	return NewFromConfig(cfg, src, log)
}

// NewFromConfig returns a server for the ops section cfg, checked already,
// over src; Start binds it. cfg.Token is not read: src.Token is.
func NewFromConfig(cfg Config, src Sources, log *slog.Logger) *Server {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Server{
		addr: cfg.Address, cfg: cfg, src: src, log: log, now: time.Now, hist: newHistory(),
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
		IdleTimeout:       s.cfg.IdleTimeout,
		MaxHeaderBytes:    maxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
	}
	s.laneSrv = s.laneServer()
	s.stop = make(chan struct{})
	srv, laneSrv, stop := s.srv, s.laneSrv, s.stop
	g := newGate(ln, s.cfg.MaxConns, s.cfg.MaxConnsPerSource, &s.gated)
	s.done.Add(3)
	go func() {
		defer s.done.Done()
		if err := srv.Serve(g); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Error("ops endpoint stopped serving", "addr", s.addr, "err", err)
		}
	}()
	go func() {
		defer s.done.Done()
		_ = laneSrv.Serve(g.lane)
	}()
	go func() {
		defer s.done.Done()
		s.sampleLoop(stop)
	}()
	s.log.Info("ops endpoint listening", "addr", ln.Addr().String(), "switch", s.switchMode(), "status_page", s.pageMode(),
		"max_conns", s.cfg.MaxConns, "max_conns_per_source", s.cfg.MaxConnsPerSource, "idle_timeout", s.cfg.IdleTimeout)
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
	srv, laneSrv, stop := s.srv, s.laneSrv, s.stop
	s.srv, s.laneSrv, s.stop = nil, nil, nil
	s.mu.Unlock()
	if srv == nil {
		return nil
	}
	close(stop)
	// The main server first: its listener, once closed, offers the lane
	// nothing more.
	err := srv.Shutdown(ctx)
	if err != nil {
		srv.Close()
	}
	if lerr := laneSrv.Shutdown(ctx); lerr != nil {
		laneSrv.Close()
		err = cmp.Or(err, lerr)
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
	mux.Handle("GET /{$}", s.loginForPage(http.HandlerFunc(s.status)))
	// The standard library's check turns away a POST that a browser marks
	// as cross-site (Sec-Fetch-Site, or an Origin unlike Host), so a page
	// elsewhere cannot ride on credentials the browser has cached for us.
	csrf := http.NewCrossOriginProtection()
	mux.Handle("POST /outputs/{name}", csrf.Handler(http.HandlerFunc(s.switchOutput)))
	mux.HandleFunc("GET /bridges/{name}/dead-letters", s.listDeadLetters)
	mux.Handle("POST /bridges/{name}/dead-letters/retry", csrf.Handler(http.HandlerFunc(s.retryDeadLetters)))
	mux.Handle("POST /bridges/{name}/dead-letters/drop", csrf.Handler(http.HandlerFunc(s.dropDeadLetters)))
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
