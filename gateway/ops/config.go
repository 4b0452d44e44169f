package ops

// Config is the ops: section of the configuration file: where the endpoint
// listens, and the token that may switch outputs.
type Config struct {
	Address string `yaml:"address"` // host:port; empty turns the endpoint off
	Token   string `yaml:"token"`   // lets the status page switch outputs when given as a form field or Bearer header; empty for none
}

// DefaultConfig returns the ops section a file leaves out: the endpoint on
// loopback, so that a network sees it only when a file says so.
func DefaultConfig() Config {
	return Config{Address: "127.0.0.1:9100"}
}

// minToken is the shortest token accepted: 16 random characters are out
// of reach of guessing over HTTP.
const minToken = 16

// Checker is what Check reports to: the configuration's own checker, seen
// through the three calls this section needs, so that ops imports nothing
// of ours.
type Checker interface {
	// Fail reports a problem at a key path.
	Fail(path, format string, args ...any)
	// HostPort checks a TCP address and reports whether it is usable.
	HostPort(path, addr, example string) bool
	// Claim records a socket the key binds and reports one bound twice.
	Claim(path, network, addr string)
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
}
