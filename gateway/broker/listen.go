package broker

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"
	"github.com/mochi-mqtt/server/v2/listeners"
)

// openListener binds the socket lc describes, or serves inherited, a
// socket systemd bound for it, in its place. TCP, TLS and unix sockets are
// served by mochi's listeners.Net; WebSocket by wsListener, which binds
// before serving so that a port in use is reported here, and which counts
// the upgrades its origin check refuses in originRefused.
func openListener(lc Listener, maxPacket int, inherited net.Listener, originRefused *atomic.Int64) (listeners.Listener, error) {
	var origins *originPolicy
	if lc.Type == ListenerWS || lc.Type == ListenerWSS {
		var err error
		if origins, err = newOriginPolicy(lc, originRefused); err != nil {
			return nil, err
		}
	}
	var tcfg *tls.Config
	if lc.Type == ListenerTLS || lc.Type == ListenerWSS {
		var err error
		if tcfg, err = tlsConfig(lc.TLS); err != nil {
			return nil, err
		}
	}
	network := "tcp"
	if lc.Type == ListenerUnix {
		network = "unix"
	}
	nl := inherited
	if nl == nil {
		var err error
		if nl, err = bindListener(network, lc.Address); err != nil {
			return nil, err
		}
	} else if got := nl.Addr().Network(); got != network {
		return nil, fmt.Errorf("systemd passed a %s socket (%s) for a %s listener", got, nl.Addr(), lc.Type)
	}
	nl = &patientListener{Listener: nl}
	switch lc.Type {
	case ListenerWS, ListenerWSS:
		return newWSListener(lc.Name, nl, tcfg, maxPacket, origins), nil
	case ListenerTLS:
		nl = tls.NewListener(nl, tcfg)
	}
	return listeners.NewNet(lc.Name, nl), nil
}

// warnAnonymous logs, loudly, every listener that admits clients without
// credentials on an address other hosts can reach, by the address it is
// really bound to: the configured one, or that of a socket systemd passed,
// which fieldgate check cannot see.
func (b *Broker) warnAnonymous() {
	if !b.opts.AllowAnonymous {
		return
	}
	for i, lc := range b.opts.Listeners {
		a, ok := b.Addr(lc.Name).(*net.TCPAddr)
		if !ok || !lc.admitsAnonymous() || a.IP.IsLoopback() {
			continue
		}
		from := "the configuration"
		if b.opts.Inherited[lc.Name] != nil {
			from = "a socket passed by systemd (socket activation), in place of the configured " + lc.Address
		}
		b.log.Warn("SECURITY: anonymous clients can connect from the network: broker.allow_anonymous is on and this listener is not on loopback; "+anonymousFix,
			"listener", lc.Name, "key", fmt.Sprintf("listeners[%d].address", i), "address", a.String(), "from", from)
	}
}

// bindListener binds the configured address.
func bindListener(network, address string) (net.Listener, error) {
	if network == "unix" {
		// A socket file left by an earlier run would block the bind.
		if fi, err := os.Lstat(address); err == nil && fi.Mode()&os.ModeSocket != 0 {
			_ = os.Remove(address)
		}
	}
	return net.Listen(network, address)
}

// tlsConfig loads a listener's certificate and, when client_ca is set,
// requires clients to present a certificate that CA signed.
func tlsConfig(t TLS) (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(t.Cert, t.Key)
	if err != nil {
		return nil, fmt.Errorf("tls.cert %s, tls.key %s: %w", t.Cert, t.Key, err)
	}
	cfg := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	if t.ClientCA != "" {
		pem, err := os.ReadFile(t.ClientCA)
		if err != nil {
			return nil, fmt.Errorf("tls.client_ca: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("tls.client_ca %s: no PEM certificate in it", t.ClientCA)
		}
		cfg.ClientCAs = pool
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return cfg, nil
}

func listenerAddr(l listeners.Listener) net.Addr {
	switch l := l.(type) {
	case *wsListener:
		return l.nl.Addr()
	case *listeners.Net:
		if a, err := net.ResolveTCPAddr("tcp", l.Address()); err == nil && l.Protocol() == "tcp" {
			return a
		}
		return &net.UnixAddr{Name: l.Address(), Net: "unix"}
	}
	return nil
}

// patientListener keeps accepting through temporary failures such as
// running out of file descriptors, which would otherwise end the accept
// loop for good; it backs off so that the failure cannot spin a core.
type patientListener struct {
	net.Listener
}

func (l *patientListener) Accept() (net.Conn, error) {
	delay := 5 * time.Millisecond
	for {
		c, err := l.Listener.Accept()
		if err == nil {
			if tc, ok := c.(*net.TCPConn); ok {
				limitUnsent(tc)
			}
			return c, nil
		}
		if errors.Is(err, net.ErrClosed) {
			return c, err
		}
		// Anything else (EMFILE, ENFILE, ENOBUFS, ECONNABORTED) passes.
		time.Sleep(delay)
		delay = min(delay*2, time.Second)
	}
}

// wsListener serves MQTT over WebSocket (the "mqtt" subprotocol, binary
// frames) on a socket bound in advance.
type wsListener struct {
	id       string
	nl       net.Listener
	tls      *tls.Config
	srv      *http.Server
	upgrader websocket.Upgrader
	origins  *originPolicy
	maxMsg   int64
	mu       sync.Mutex
}

func newWSListener(id string, nl net.Listener, tcfg *tls.Config, maxPacket int, origins *originPolicy) *wsListener {
	return &wsListener{
		id:  id,
		nl:  nl,
		tls: tcfg,
		upgrader: websocket.Upgrader{
			Subprotocols:    []string{"mqtt"},
			ReadBufferSize:  1024,
			WriteBufferSize: 1024,
			// The handler has checked the origin already (origin.go),
			// refusing with a reason, a count and a log line.
			CheckOrigin: func(*http.Request) bool { return true },
		},
		origins: origins,
		maxMsg:  int64(maxPacket) + 8,
	}
}

func (l *wsListener) ID() string { return l.id }
func (l *wsListener) Address() string {
	return l.nl.Addr().String()
}
func (l *wsListener) Protocol() string {
	if l.tls != nil {
		return "wss"
	}
	return "ws"
}
func (l *wsListener) Init(log *slog.Logger) error {
	if log != nil {
		l.origins.log.Store(log)
	}
	return nil
}

func (l *wsListener) Serve(establish listeners.EstablishFn) {
	l.mu.Lock()
	l.srv = &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if ok, why := l.origins.check(r); !ok {
				l.origins.refuse(w, r, why)
				return
			}
			ws, err := l.upgrader.Upgrade(w, r, nil)
			if err != nil {
				return
			}
			ws.SetReadLimit(l.maxMsg)
			wc := &wsConn{Conn: ws.UnderlyingConn(), ws: ws}
			if r.TLS != nil && len(r.TLS.VerifiedChains) > 0 && len(r.TLS.VerifiedChains[0]) > 0 {
				wc.cn = r.TLS.VerifiedChains[0][0].Subject.CommonName
			}
			_ = establish(l.id, wc)
		}),
		ReadHeaderTimeout: connectTimeout,
		TLSConfig:         l.tls,
	}
	srv := l.srv
	l.mu.Unlock()
	if l.tls != nil {
		_ = srv.Serve(tls.NewListener(l.nl, l.tls))
		return
	}
	_ = srv.Serve(l.nl)
}

func (l *wsListener) Close(listeners.CloseFn) {
	l.mu.Lock()
	srv := l.srv
	l.mu.Unlock()
	if srv != nil {
		_ = srv.Close()
		return
	}
	_ = l.nl.Close()
}

// wsConn is one WebSocket connection as a net.Conn: MQTT bytes travel in
// binary messages, a packet may span messages and a message may hold
// several packets [MQTT-6.0.0-2] [MQTT-6.0.0-3].
type wsConn struct {
	net.Conn
	ws *websocket.Conn
	r  interface{ Read([]byte) (int, error) }
	cn string // verified client certificate common name, on wss
}

func (c *wsConn) verifiedName() string { return c.cn }

func (c *wsConn) Read(p []byte) (int, error) {
	for {
		if c.r == nil {
			kind, r, err := c.ws.NextReader()
			if err != nil {
				return 0, err
			}
			if kind != websocket.BinaryMessage {
				return 0, errors.New("websocket: text message; MQTT needs binary [MQTT-6.0.0-1]")
			}
			c.r = r
		}
		n, err := c.r.Read(p)
		if err != nil {
			c.r = nil
			if n > 0 || errors.Is(err, io.EOF) {
				if n > 0 {
					return n, nil
				}
				continue
			}
			return n, err
		}
		if n > 0 {
			return n, nil
		}
	}
}

func (c *wsConn) Write(p []byte) (int, error) {
	if err := c.ws.WriteMessage(websocket.BinaryMessage, p); err != nil {
		return 0, err
	}
	return len(p), nil
}
