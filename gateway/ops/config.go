package ops

import "time"

// Config is the ops: section of the configuration file: where the endpoint
// listens, the token that may switch outputs, and the bounds on the
// connections anyone who reaches the address can open.
type Config struct {
	Address string `yaml:"address"` // host:port; empty turns the endpoint off
	Token   string `yaml:"token"`   // lets the status page switch outputs when given as a form field or Bearer header; empty for none
	// IdleTimeout closes a keep-alive connection that sends no request
	// for this long, giving its slot back.
	IdleTimeout time.Duration `yaml:"idle_timeout"`
	// MaxConns bounds the connections served at once, from all sources.
	MaxConns int `yaml:"max_conns"`
	// MaxConnsPerSource bounds those of one source address, so that one
	// host cannot hold every slot.
	MaxConnsPerSource int `yaml:"max_conns_per_source"`
}

// Defaults of the connection bounds. A scraper, a probe, a phone and an
// operator's browser are the expected clients; a browser opens up to six
// connections to one host, so eight per source serve one with a probe
// beside it, and four such sources fit in the total. Each connection
// costs a goroutine and about 10 KiB of buffers, so the total caps the
// endpoint near half a megabyte. A browser reuses a connection within
// seconds while a page loads or refreshes (every 10 s); a slot held idle
// longer than that is better given to someone else.
const (
	DefaultIdleTimeout       = 10 * time.Second
	DefaultMaxConns          = 32
	DefaultMaxConnsPerSource = 8
)

// Bounds the check allows for the connection limits.
const (
	minIdleTimeout = time.Second
	maxIdleTimeout = 5 * time.Minute
	maxMaxConns    = 1024
)

// DefaultConfig returns the ops section a file leaves out: the endpoint on
// loopback, so that a network sees it only when a file says so.
func DefaultConfig() Config {
	return Config{
		Address:           "127.0.0.1:9100",
		IdleTimeout:       DefaultIdleTimeout,
		MaxConns:          DefaultMaxConns,
		MaxConnsPerSource: DefaultMaxConnsPerSource,
	}
}

// minToken is the shortest token accepted: 16 random characters are out
// of reach of guessing over HTTP.
const minToken = 16

// Checker is what Check reports to: the configuration's own checker, seen
// through the calls this section needs, so that ops imports nothing of
// ours.
type Checker interface {
	// Fail reports a problem at a key path.
	Fail(path, format string, args ...any)
	// HostPort checks a TCP address and reports whether it is usable.
	HostPort(path, addr, example string) bool
	// Claim records a socket the key binds and reports one bound twice.
	Claim(path, network, addr string)
	// IntRange reports n unless lo <= n <= hi.
	IntRange(path string, n, lo, hi int, example string)
}

// Check reports the section's problems to k, under the key ops.
func (c Config) Check(k Checker) {
	if a := c.Address; a != "" {
		if k.HostPort("ops.address", a, "127.0.0.1:9100") {
			k.Claim("ops.address", "tcp", a)
		}
	}
	if t := c.Token; t != "" && len(t) < minToken {
		k.Fail("ops.token", "%d characters can be guessed; use at least %d, such as the output of openssl rand -hex 16", len(t), minToken)
	}
	if d := c.IdleTimeout; d < minIdleTimeout || d > maxIdleTimeout {
		k.Fail("ops.idle_timeout", "%s is out of range; use %s to %s, such as %s", d, minIdleTimeout, maxIdleTimeout, DefaultIdleTimeout)
	}
	k.IntRange("ops.max_conns", c.MaxConns, 1, maxMaxConns, "32")
	// One source may hold at most every slot; against a max_conns out of
	// range only the bound of max_conns is meant.
	k.IntRange("ops.max_conns_per_source", c.MaxConnsPerSource, 1, min(max(1, c.MaxConns), maxMaxConns), "8")
}
