package broker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fieldgate/fieldgate/gateway/broker/auth"
	"github.com/fieldgate/fieldgate/matcher"
	"github.com/fieldgate/fieldgate/storage"
	"github.com/mochi-mqtt/server/v2/listeners"
)

// Options configures a Broker.
type Options struct {
	Config
	Listeners []Listener // bound by Start; may be empty for in-process use
	Version   string     // reported on $SYS/broker/version

	// Inherited are listeners passed by systemd socket activation, by
	// FileDescriptorName = the listener's configured name; Start serves
	// each in place of binding that listener's address, and closes those
	// whose name matches no listener.
	Inherited map[string]net.Listener

	// Store keeps persistent sessions and retained messages; nil keeps
	// them in memory only.
	Store          *storage.DB
	MaxStoredBytes int64  // queued messages of all persistent sessions, in bytes
	QueuePolicy    string // storage.QueueDropOldest or storage.QueueRefuse

	// Outbound are offered every routed message before its publisher is
	// acknowledged: the bridges' outboxes.
	Outbound []Outbound
	// Alive, when set, is called about once a second from the broker's
	// housekeeping loop, which takes the session locks: a watchdog that
	// stops hearing it knows the broker is stuck.
	Alive func()
}

// Outbound is offered every message the broker routes, other than its own
// $SYS topics, before the publisher is acknowledged: a bridge's outbox
// takes what it carries upstream into the same storage batch as the
// publish's other effects, so it is on disk when the PUBACK goes.
type Outbound interface {
	// Offer queues m when it wants it, adding what must be durable to
	// batch (nil for a broker without storage). It returns nil, or why m
	// must be refused: an error wrapping ErrQueueFull when a queue that
	// never drops is full, or ErrTopicRefused when the topic breaks the
	// rules of where the Outbound would send it. Local subscribers get m
	// either way. It runs on the publisher's goroutine and must not block.
	Offer(m *Offered, batch *storage.Batch) error
}

// Offered is a routed message as an Outbound sees it. Payload is shared
// with every receiver: do not modify it.
type Offered struct {
	Topic   string
	Payload []byte
	QoS     byte
	Retain  bool
	From    string // the publishing client's id; empty for the broker's own messages (wills)
}

// Broker is the MQTT server. Create it with New, bind its listeners with
// Start, stop it with Shutdown.
type Broker struct {
	opts  Options
	log   *slog.Logger
	index *matcher.Index
	// users is nil without a password file; checked through the broker's
	// own auth.Authenticator, replaced whole by ReloadPasswords.
	users atomic.Pointer[auth.Passwords]
	auth  *auth.Authenticator      // the bcrypt queue, cache and failed-login table; nil without a password file
	acl   atomic.Pointer[auth.ACL] // replaced whole by SetACL
	// outbound is Options.Outbound, replaced whole by SetOutbound.
	outbound atomic.Pointer[[]Outbound]
	start    time.Time

	// mu guards sessions and the life cycle of every session: connect,
	// takeover, disconnect and expiry.
	mu       sync.Mutex
	sessions map[string]*session

	// hmu guards handles and free: the route path reads them under RLock.
	hmu     sync.RWMutex
	handles []*session // by matcher.Handle; index 0 unused
	free    []matcher.Handle

	retained retainedStore

	// lmu guards the listeners and live connections.
	lmu       sync.Mutex
	closed    bool
	listeners []listeners.Listener
	addrs     map[string]net.Addr
	conns     sync.WaitGroup
	live      map[*conn]struct{}

	store         *storage.DB
	restoredWills []*message // wills due from the previous run, sent at Start

	stop      chan struct{}
	houseDone chan struct{}
	stats     stats
	quota     quota

	dropLog  atomic.Int64 // unix seconds of the last "dropped" log line
	loginLog atomic.Int64 // unix seconds of the last "refusing logins" log line
}

// stats are the counters $SYS and the ops endpoint report.
type stats struct {
	msgsRecv, msgsSent, bytesRecv, bytesSent, dropped atomic.Int64
	refused                                           atomic.Int64 // messages a queue policy turned away
	withheld                                          atomic.Int64 // deliveries the ACL withheld from a checked subscription
	originRefused                                     atomic.Int64 // WebSocket upgrades refused for their Origin
	connected, totalConns                             atomic.Int64
}

// Errors New and Start return.
var (
	ErrClosed = errors.New("broker: closed")
)

// New builds a broker from opts; it reads the password file but binds
// nothing.
func New(opts Options, log *slog.Logger) (*Broker, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	b := &Broker{
		opts:     opts,
		log:      log,
		index:    matcher.NewIndex(),
		sessions: make(map[string]*session),
		handles:  make([]*session, 1),
		addrs:    make(map[string]net.Addr),
		live:     make(map[*conn]struct{}),
		stop:     make(chan struct{}),
		start:    time.Now(),
	}
	b.retained.init()
	b.store = opts.Store
	b.retained.db, b.retained.log = opts.Store, log
	if b.opts.MaxStoredBytes <= 0 {
		b.opts.MaxStoredBytes = int64(storage.DefaultConfig().MaxQueuedBytes)
	}
	if opts.PasswordFile != "" {
		b.auth = auth.NewLimitedAuthenticator(opts.Login)
		users, err := b.auth.LoadPasswords(opts.PasswordFile)
		if err != nil {
			return nil, fmt.Errorf("broker: broker.password_file: %w", err)
		}
		b.users.Store(users)
	}
	b.acl.Store(auth.NewACL(opts.ACL))
	out := slices.Clone(opts.Outbound)
	b.outbound.Store(&out)
	if err := b.restore(); err != nil {
		return nil, err
	}
	if err := b.restoreBounds(); err != nil {
		return nil, err
	}
	return b, nil
}

// Start binds every configured listener, or takes the socket systemd
// passed for it in Options.Inherited, and starts serving. On a bind error
// nothing stays bound and the error names the listener.
func (b *Broker) Start() error {
	b.closeUnclaimed()
	var ls []listeners.Listener
	for i, lc := range b.opts.Listeners {
		inherited := b.opts.Inherited[lc.Name]
		l, err := openListener(lc, b.opts.MaxPacketSize, inherited, &b.stats.originRefused)
		if err != nil {
			for _, l := range ls {
				l.Close(func(string) {})
			}
			// The sockets systemd passed for the listeners not yet opened
			// would otherwise stay open with nobody accepting.
			for _, lc := range b.opts.Listeners[i:] {
				if nl := b.opts.Inherited[lc.Name]; nl != nil {
					nl.Close()
				}
			}
			return fmt.Errorf("broker: listener %q: %w", lc.Name, err)
		}
		if inherited != nil {
			b.log.Info("serving a socket passed by systemd in place of the configured address",
				"listener", lc.Name, "configured", lc.Address, "address", inherited.Addr())
		}
		ls = append(ls, l)
	}
	b.lmu.Lock()
	for i, l := range ls {
		b.listeners = append(b.listeners, l)
		b.addrs[b.opts.Listeners[i].Name] = listenerAddr(l)
	}
	b.lmu.Unlock()
	for _, l := range ls {
		if err := l.Init(b.log); err != nil {
			return fmt.Errorf("broker: listener %q: %w", l.ID(), err)
		}
		go l.Serve(b.establish)
		b.log.Info("listening", "listener", l.ID(), "protocol", l.Protocol(), "address", l.Address())
	}
	b.warnAnonymous()
	b.houseDone = make(chan struct{})
	go b.housekeep()
	for _, m := range b.restoredWills {
		b.publishOwn(m)
	}
	b.restoredWills = nil
	return nil
}

// closeUnclaimed closes the inherited sockets no configured listener
// names: serving them would expose what the configuration does not ask for.
func (b *Broker) closeUnclaimed() {
	for name, nl := range b.opts.Inherited {
		if !slices.ContainsFunc(b.opts.Listeners, func(lc Listener) bool { return lc.Name == name }) {
			b.log.Warn("closing a socket passed by systemd: no listener has its name; set FileDescriptorName= to a listener's name",
				"name", name, "address", nl.Addr())
			nl.Close()
		}
	}
}

// Addr returns the bound address of the named listener, nil if none.
func (b *Broker) Addr(name string) net.Addr {
	b.lmu.Lock()
	defer b.lmu.Unlock()
	return b.addrs[name]
}

// establish serves one accepted connection; listeners call it on their
// own goroutine, which becomes the connection's reader.
func (b *Broker) establish(listener string, nc net.Conn) error {
	b.ServeConn(listener, nc)
	return nil
}

// ServeConn serves one client on nc until it disconnects, then closes nc.
// Listeners call it; it is exported for tests and socket activation.
func (b *Broker) ServeConn(listener string, nc net.Conn) {
	c := newConn(b, nc, listener)
	b.lmu.Lock()
	if b.closed {
		b.lmu.Unlock()
		nc.Close()
		return
	}
	b.conns.Add(1)
	b.live[c] = struct{}{}
	b.lmu.Unlock()
	defer func() {
		b.lmu.Lock()
		delete(b.live, c)
		b.lmu.Unlock()
		b.conns.Done()
	}()
	c.serve()
}

// Shutdown stops accepting, disconnects every client with reason 0x8B
// (MQTT 5) and waits for their connections to end or ctx to expire; then
// it closes the sockets of those still open.
// Wills of disconnected clients are handled as for any network failure:
// sent now when their delay is zero, dropped with the in-memory sessions
// otherwise.
func (b *Broker) Shutdown(ctx context.Context) error {
	b.lmu.Lock()
	if b.closed {
		b.lmu.Unlock()
		return nil
	}
	b.closed = true
	ls := b.listeners
	live := make([]*conn, 0, len(b.live))
	for c := range b.live {
		live = append(live, c)
	}
	b.lmu.Unlock()

	for _, l := range ls {
		l.Close(func(string) {})
	}
	for _, c := range live {
		c.shutdown(rcShuttingDown, "")
	}
	close(b.stop)
	if b.houseDone != nil {
		<-b.houseDone
	}
	done := make(chan struct{})
	go func() {
		b.conns.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		// What is left loses its socket now, so that no connection
		// outlives Shutdown by a write timeout: a writer blocked on a
		// client that stopped reading fails at once.
		for _, c := range live {
			c.nc.Close()
		}
		return fmt.Errorf("broker: shutdown: %w", ctx.Err())
	}
}

// newHandle gives a session its index handle; the caller holds b.mu.
func (b *Broker) newHandle(s *session) (matcher.Handle, error) {
	b.hmu.Lock()
	defer b.hmu.Unlock()
	if n := len(b.free); n > 0 {
		h := b.free[n-1]
		b.free = b.free[:n-1]
		b.handles[h] = s
		return h, nil
	}
	if len(b.handles) > int(matcher.MaxHandle) {
		return 0, errors.New("too many sessions")
	}
	b.handles = append(b.handles, s)
	return matcher.Handle(len(b.handles) - 1), nil
}

// endSession removes s for good: its subscriptions, queues and handle.
// The caller holds b.mu.
func (b *Broker) endSession(s *session) {
	if b.sessions[s.id] == s {
		delete(b.sessions, s.id)
		b.releaseSession(s.id)
	}
	s.mu.Lock()
	s.ended = true
	if s.stored {
		var bt storage.Batch
		bt.DeleteSession(s.id)
		b.store.Commit(&bt, nil)
		s.stored = false
	}
	for f := range s.subs {
		b.index.Unsubscribe(s.handle, f)
	}
	s.subs = nil
	s.endScansLocked("")
	s.inflight, s.pending, s.pendingB, s.grace, s.awaitingRel, s.unstored = nil, nil, 0, 0, nil, nil
	s.mu.Unlock()
	b.index.SetOnline(s.handle, true)
	b.hmu.Lock()
	b.handles[s.handle] = nil
	b.free = append(b.free, s.handle)
	b.hmu.Unlock()
}

// logDrop logs dropped messages at most once a minute, so that a stalled
// client cannot fill the journal.
func (b *Broker) logDrop(clientID, why string) {
	now := time.Now().Unix()
	last := b.dropLog.Load()
	if now-last < 60 || !b.dropLog.CompareAndSwap(last, now) {
		return
	}
	b.log.Warn("dropping messages", "client", clientID, "why", why, "dropped_total", b.stats.dropped.Load())
}

// housekeep runs once a second: due wills, expired sessions, stalled
// windows, retained changes storage has applied, and $SYS.
func (b *Broker) housekeep() {
	defer close(b.houseDone)
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	var nextSys time.Time
	for {
		select {
		case <-b.stop:
			return
		case now := <-tick.C:
			b.sweep(now)
			b.retained.tidy()
			if b.opts.Alive != nil {
				b.opts.Alive()
			}
			if b.opts.SysInterval > 0 && !now.Before(nextSys) {
				b.publishSys(now)
				// Ticks come a little late or early; without half a
				// tick of slack, an early one would wait a whole
				// second more than the interval.
				nextSys = now.Add(b.opts.SysInterval - time.Second/2)
			}
		}
	}
}

// sweep sends due wills, ends expired sessions and disconnects clients
// whose acknowledgements have stalled.
func (b *Broker) sweep(now time.Time) {
	var wills []*message
	var stalled []*conn
	b.mu.Lock()
	for _, s := range b.sessions {
		s.mu.Lock()
		c := s.conn
		if c == nil && s.will != nil && !s.willAt.IsZero() && !now.Before(s.willAt) {
			wills = append(wills, s.will.message(now))
			s.will = nil
		}
		if c != nil && len(s.inflight) > 0 && now.Sub(s.inflight[0].sent) > b.opts.InflightTimeout {
			stalled = append(stalled, c)
		}
		expired := c == nil && !s.expireAt.IsZero() && !now.Before(s.expireAt)
		if expired && s.will != nil {
			// The session ends before the will delay: send it now
			// [MQTT-3.1.3-9].
			wills = append(wills, s.will.message(now))
			s.will = nil
		}
		s.mu.Unlock()
		if expired {
			b.endSession(s)
		}
	}
	b.mu.Unlock()
	for _, m := range wills {
		b.publishOwn(m)
	}
	for _, c := range stalled {
		b.log.Warn("disconnecting a stalled client", "client", c.clientID, "waited", b.opts.InflightTimeout)
		c.shutdown(rcQuotaExceeded, "")
	}
}

// CheckPassword reports whether password is user's in the broker's
// password file, as an MQTT login would: within the same bound on bcrypt
// and with the same remembered checks. It is false without a password file.
func (b *Broker) CheckPassword(user string, password []byte) bool {
	return b.users.Load().Check(user, password)
}

// CheckPasswordFrom is CheckPassword for a login from remote (host:port):
// the failures of its address count, as an MQTT login's do, and an
// address that failed too often is refused without a check. The ops
// endpoint's basic auth goes through it.
func (b *Broker) CheckPasswordFrom(remote, user string, password []byte) bool {
	o := b.users.Load().CheckFrom(auth.Source(remote), user, password)
	b.logLoginRefused(o, remote, user)
	return o == auth.Accepted
}

// SetOutbound replaces the outbound queues offered every routed message,
// as when the bridges are reconfigured.
func (b *Broker) SetOutbound(out []Outbound) {
	out = slices.Clone(out)
	b.outbound.Store(&out)
}
