package broker

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// A browser lets any page open a WebSocket to any address, its loopback
// addresses included, and tells the server only the page's origin. A page
// from the internet in the browser of someone on the plant's network could
// otherwise publish on a ws listener that admits anonymous clients, or ride
// on a listener only that machine can reach. So a ws or wss listener
// accepts an upgrade only when
//
//   - it carries no Origin header: not a browser (mosquitto, Paho, Node);
//   - the Origin names the host and port the request was sent to (Host), as
//     browsers' same-origin rule has it; on a socket bound to loopback the
//     host must also be a loopback name or address, since a page can point
//     a DNS name of its own at 127.0.0.1 and then be "same-origin";
//   - or the Origin is one of the listener's allowed_origins.
//
// Anything else is answered 403 before the upgrade, counted and logged.

// originRefusalLogEvery bounds how often one listener logs refused
// origins: a page retrying in a loop must not fill the journal, and the
// first refusal, the one an operator looks for, is always logged.
const originRefusalLogEvery = 10 * time.Second

// originPolicy decides which Origin headers a ws or wss listener accepts.
type originPolicy struct {
	listener string
	tls      bool                // wss: a Host without a port means 443
	allowed  map[string]struct{} // canonical origins from allowed_origins
	refused  *atomic.Int64       // the broker's count of refused upgrades, all listeners
	lastLog  atomic.Int64        // unix seconds of the last refusal logged
	log      atomic.Pointer[slog.Logger]
}

func newOriginPolicy(lc Listener, refused *atomic.Int64) (*originPolicy, error) {
	p := &originPolicy{
		listener: lc.Name,
		tls:      lc.Type == ListenerWSS,
		allowed:  make(map[string]struct{}, len(lc.AllowedOrigins)),
		refused:  refused,
	}
	if p.refused == nil {
		p.refused = new(atomic.Int64)
	}
	p.log.Store(slog.New(slog.DiscardHandler))
	for i, o := range lc.AllowedOrigins {
		c, err := parseOrigin(o)
		if err != nil {
			return nil, fmt.Errorf("allowed_origins[%d]: %q %w", i, o, err)
		}
		p.allowed[c] = struct{}{}
	}
	return p, nil
}

// check reports whether r may be upgraded, and why not.
func (p *originPolicy) check(r *http.Request) (bool, string) {
	values := r.Header.Values("Origin")
	switch len(values) {
	case 0:
		return true, ""
	case 1:
	default:
		return false, "more than one Origin header"
	}
	origin, err := parseOrigin(values[0])
	if err != nil {
		return false, "Origin " + err.Error()
	}
	if _, ok := p.allowed[origin]; ok {
		return true, ""
	}
	if p.sameHost(origin, r) {
		return true, ""
	}
	return false, "Origin is neither the listener's own host and port nor in allowed_origins"
}

// sameHost reports whether origin (canonical) names the host and port of
// the request's Host header, on a socket where that host can be trusted.
func (p *originPolicy) sameHost(origin string, r *http.Request) bool {
	_, hostport, _ := strings.Cut(origin, "://")
	defPort := "80"
	if p.tls {
		defPort = "443"
	}
	host, port := splitHostDefault(r.Host, defPort)
	if host == "" || !strings.EqualFold(hostport, net.JoinHostPort(host, port)) {
		return false
	}
	if local, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr); ok && addrIsLoopback(local) {
		return hostIsLoopback(host)
	}
	return true
}

// refuse answers 403, counts the refusal and logs it, at most once per
// originRefusalLogEvery.
func (p *originPolicy) refuse(w http.ResponseWriter, r *http.Request, why string) {
	n := p.refused.Add(1)
	now := time.Now().Unix()
	if last := p.lastLog.Load(); now-last >= int64(originRefusalLogEvery/time.Second) && p.lastLog.CompareAndSwap(last, now) {
		p.log.Load().Warn("refused a WebSocket upgrade from a web page of another origin; list the page's origin in allowed_origins if it should connect",
			"listener", p.listener, "remote", r.RemoteAddr, "origin", r.Header.Get("Origin"), "host", r.Host,
			"why", why, "refused_total", n)
	}
	h := w.Header()
	h.Set("Content-Type", "text/plain; charset=utf-8")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Connection", "close") // nothing more is read from this socket
	w.WriteHeader(http.StatusForbidden)
	_, _ = w.Write([]byte("403 forbidden: WebSocket connections from this origin are not allowed\n"))
}

// parseOrigin checks an origin as browsers send it (scheme://host[:port],
// RFC 6454) and returns it canonical: lower case, the port always written,
// so that https://Example.com and https://example.com:443 compare equal.
// Its errors read after the origin: "…" has no host.
func parseOrigin(s string) (string, error) {
	u, err := url.Parse(s)
	if err != nil {
		return "", errors.New("is not a URL")
	}
	scheme := strings.ToLower(u.Scheme)
	var defPort string
	switch scheme {
	case "http":
		defPort = "80"
	case "https":
		defPort = "443"
	case "":
		return "", errors.New("has no scheme")
	default:
		return "", fmt.Errorf("has the scheme %q; pages come from http or https", u.Scheme)
	}
	switch {
	case u.Opaque != "" || u.Host == "":
		return "", errors.New("has no host")
	case u.User != nil:
		return "", errors.New("has a user name, which an origin never has")
	case u.Path != "" || u.RawQuery != "" || u.ForceQuery || u.Fragment != "":
		return "", errors.New("has a path, query or fragment, which an origin never has")
	}
	host, port := splitHostDefault(u.Host, defPort)
	if host == "" {
		return "", errors.New("has no host")
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return "", fmt.Errorf("has the port %q; use a number from 1 to 65535", port)
	}
	return scheme + "://" + net.JoinHostPort(strings.ToLower(host), port), nil
}

// splitHostDefault splits host[:port], an IPv6 address in brackets, and
// fills in defPort when there is no port.
func splitHostDefault(hostport, defPort string) (host, port string) {
	if h, p, err := net.SplitHostPort(hostport); err == nil {
		if p == "" {
			p = defPort
		}
		return h, p
	}
	return strings.TrimSuffix(strings.TrimPrefix(hostport, "["), "]"), defPort
}

// hostIsLoopback reports whether a Host header's host can only mean this
// machine: localhost or a loopback address, never a DNS name someone else
// controls.
func hostIsLoopback(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// addrIsLoopback reports whether a socket's address is a loopback one.
func addrIsLoopback(a net.Addr) bool {
	if ta, ok := a.(*net.TCPAddr); ok {
		return ta.IP.IsLoopback()
	}
	return false
}
