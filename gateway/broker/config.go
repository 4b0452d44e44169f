package broker

import (
	"fmt"
	"net"
	"time"

	"github.com/fieldgate/fieldgate/gateway/broker/auth"
	"github.com/fieldgate/fieldgate/internal/check"
	"github.com/fieldgate/fieldgate/internal/mqttwire"
)

// Config is the broker: section of the configuration file: who may
// connect, and the limits that bound what one client can make the broker
// hold.
type Config struct {
	AllowAnonymous bool           `yaml:"allow_anonymous"` // let clients connect without credentials
	PasswordFile   string         `yaml:"password_file"`   // user:bcrypt-hash lines, written by fieldgate passwd
	ACL            []auth.ACLRule `yaml:"acl"`             // when non-empty, only what a rule allows is allowed
	MaxPacketSize  int            `yaml:"max_packet_size"` // bytes; larger packets are refused
	MaxKeepalive   time.Duration  `yaml:"max_keepalive"`   // longest keepalive a client may ask for

	// MaxSessionExpiry caps how long a disconnected session is kept; it also
	// bounds MQTT 3.1.1 sessions with clean session off, which would
	// otherwise never expire.
	MaxSessionExpiry time.Duration `yaml:"max_session_expiry"`
	ReceiveMaximum   int           `yaml:"receive_maximum"`     // QoS 1/2 publishes a client may have unacknowledged towards us
	MaxInflight      int           `yaml:"max_inflight"`        // QoS 1/2 messages we send a client before waiting for its acks
	TopicAliasMax    int           `yaml:"topic_alias_maximum"` // aliases a client may use towards us, and we towards it
	MaxSubscriptions int           `yaml:"max_subscriptions"`   // per client; bounds the work one client adds to every publish
	MaxQueuedBytes   int           `yaml:"max_queued_bytes"`    // per client: messages waiting to be written or acknowledged
	// The bounds on what clients can make the broker keep after they
	// leave: persistent sessions and their filters, and retained
	// messages, in all and per user. See quota.go.
	MaxPersistentSessions        int `yaml:"max_persistent_sessions"`          // sessions with an expiry, all users together
	MaxPersistentSessionsPerUser int `yaml:"max_persistent_sessions_per_user"` // of those, per user name (anonymous clients share one)
	MaxFilterBytes               int `yaml:"max_filter_bytes"`                 // bytes of one topic filter
	MaxSessionFilterBytes        int `yaml:"max_session_filter_bytes"`         // bytes of all of one session's filters
	MaxRetained                  int `yaml:"max_retained_messages"`            // retained messages, all users together
	MaxRetainedBytes             int `yaml:"max_retained_bytes"`               // their topic, properties and payload bytes
	MaxRetainedPerUser           int `yaml:"max_retained_messages_per_user"`   // retained messages one user has set
	MaxRetainedBytesPerUser      int `yaml:"max_retained_bytes_per_user"`      // their bytes
	// InflightTimeout disconnects a client whose oldest unacknowledged
	// QoS 1/2 message has waited this long: its window has stalled.
	InflightTimeout time.Duration `yaml:"inflight_timeout"`
	ReadBuffer      int           `yaml:"read_buffer"`  // bytes per connection for reading
	WriteBuffer     int           `yaml:"write_buffer"` // bytes per connection for writing, held only while writing
	SysInterval     time.Duration `yaml:"sys_interval"` // how often $SYS/broker/... is published; 0 turns it off

	// Login bounds what failed logins cost: the bcrypt queue and the
	// failures one source address may make.
	Login auth.LoginLimits `yaml:"login"`
}

// ListenerType is the transport a listener accepts MQTT on.
type ListenerType string

// The listener types the broker serves.
const (
	ListenerTCP  ListenerType = "tcp"
	ListenerTLS  ListenerType = "tls"
	ListenerWS   ListenerType = "ws"
	ListenerWSS  ListenerType = "wss"
	ListenerUnix ListenerType = "unix"
)

// Listener is one socket the broker accepts clients on: an item of the
// configuration file's listeners: list.
type Listener struct {
	Name    string       `yaml:"name"`    // unique; appears in logs and metrics
	Type    ListenerType `yaml:"type"`    // the transport
	Address string       `yaml:"address"` // host:port, or a socket path for unix
	TLS     TLS          `yaml:"tls"`

	// AllowedOrigins are the web origins (scheme://host[:port]) whose pages
	// may open a ws or wss listener, besides clients that send no Origin
	// and pages on the listener's own host and port. Empty by default, so
	// that no page elsewhere can reach the broker through a browser.
	AllowedOrigins []string `yaml:"allowed_origins"`
}

// TLS names the PEM files of a tls or wss listener.
type TLS struct {
	Cert     string `yaml:"cert"`
	Key      string `yaml:"key"`
	ClientCA string `yaml:"client_ca"` // when set, clients must present a certificate it signed
}

// DefaultConfig returns the broker section a file leaves out.
func DefaultConfig() Config {
	return Config{
		// Off unless a config turns it on: a gateway on a plant network
		// must not accept strangers by default.
		AllowAnonymous: false,
		// 256 KiB covers sensor payloads and firmware chunks with room to
		// spare while bounding what one client can make us buffer on a
		// 512 MB board.
		MaxPacketSize: 256 << 10,
		MaxKeepalive:  10 * time.Minute,
		// A week covers a device that is away over a long weekend plus
		// repairs; past that its queue is more likely waste than value.
		MaxSessionExpiry: 7 * 24 * time.Hour,
		// Receive maximum and inflight window: enough to keep a LAN
		// link busy, few enough that a stalled client pins little.
		ReceiveMaximum: 64,
		MaxInflight:    64,
		TopicAliasMax:  64,
		// A field device needs a handful of filters; 100 leaves room
		// for dashboards while keeping one client from growing the
		// index's shape count, which every publish pays for.
		MaxSubscriptions: 100,
		// 1 MiB per client holds thousands of sensor readings. A
		// message counts its topic and payload twice plus 256 bytes:
		// what it pins when this client is its only holder.
		MaxQueuedBytes:  1 << 20,
		InflightTimeout: 2 * time.Minute,
		// Sized for a 512 MB board under the unit's MemoryMax=192M, with
		// every bound reached at once (measured by the reliability
		// suite's hostile bounds case): see quota.go for what each costs.
		MaxPersistentSessions:        defaultMaxPersistentSessions,
		MaxPersistentSessionsPerUser: defaultMaxPersistentSessionsPerUser,
		MaxFilterBytes:               defaultMaxFilterBytes,
		MaxSessionFilterBytes:        defaultMaxSessionFilterBytes,
		MaxRetained:                  defaultMaxRetained,
		MaxRetainedBytes:             defaultMaxRetainedBytes,
		MaxRetainedPerUser:           defaultMaxRetainedPerUser,
		MaxRetainedBytesPerUser:      defaultMaxRetainedBytesPerUser,
		// Reads are sized for a typical sensor PUBLISH; larger packets
		// are read straight into their own buffer. The write buffer is
		// borrowed from a pool only while there is something to write.
		ReadBuffer:  1 << 10,
		WriteBuffer: 4 << 10,
		SysInterval: 10 * time.Second,
		Login:       auth.DefaultLoginLimits(),
	}
}

// DefaultListeners returns the listeners a file leaves out: one on
// loopback, so that a network reaches the broker only when a file says so.
func DefaultListeners() []Listener {
	return []Listener{{Name: "default", Type: ListenerTCP, Address: "127.0.0.1:1883"}}
}

// Check reports the section's problems to k, under the key broker.
// storeBudget is storage.max_queued_bytes, the budget of all persistent
// sessions together, which one session's budget must fit in.
func (c Config) Check(k *check.Checker, storeBudget int) {
	if n := c.MaxPacketSize; n < 1 || n > mqttwire.MaxPacket {
		k.Fail("broker.max_packet_size", "%d is out of range; use 1 to %d bytes (the largest packet MQTT can encode)", n, mqttwire.MaxPacket)
	}
	if ka := c.MaxKeepalive; ka < time.Second || ka > mqttwire.MaxKeepAlive || ka%time.Second != 0 {
		k.Fail("broker.max_keepalive", "%s is not allowed; use whole seconds from 1s to %s (the largest keepalive MQTT can carry)", ka, mqttwire.MaxKeepAlive)
	}
	if n, one := storeBudget, c.MaxQueuedBytes; n < one {
		if k.Either("storage.max_queued_bytes", "broker.max_queued_bytes") == "storage.max_queued_bytes" {
			k.Fail("storage.max_queued_bytes", "%d is smaller than broker.max_queued_bytes (%d), the budget of one session; use at least that, such as %d", n, one, 64<<20)
		} else {
			k.Fail("broker.max_queued_bytes", "%d is more than storage.max_queued_bytes (%d), the budget of all sessions together; use at most that, or raise storage.max_queued_bytes", one, n)
		}
	}
	k.IntRange("broker.receive_maximum", c.ReceiveMaximum, 1, mqttwire.MaxTwoByte, "64")
	k.IntRange("broker.max_inflight", c.MaxInflight, 1, mqttwire.MaxTwoByte, "64")
	k.IntRange("broker.topic_alias_maximum", c.TopicAliasMax, 0, mqttwire.MaxTwoByte, "64, or 0 to refuse aliases")
	k.IntRange("broker.max_subscriptions", c.MaxSubscriptions, 1, 1<<20, "100")
	k.IntRange("broker.read_buffer", c.ReadBuffer, 64, 1<<20, "1024")
	k.IntRange("broker.write_buffer", c.WriteBuffer, 64, 1<<20, "4096")
	if n := c.MaxQueuedBytes; n < queuedCost(c.MaxPacketSize) {
		if k.Either("broker.max_queued_bytes", "broker.max_packet_size") == "broker.max_queued_bytes" {
			k.Fail("broker.max_queued_bytes", "%d is too small for broker.max_packet_size (%d): a queued message counts its bytes twice plus 256, so a client could not receive one largest packet; use at least %d, such as %d", n, c.MaxPacketSize, queuedCost(c.MaxPacketSize), max(1<<20, queuedCost(c.MaxPacketSize)))
		} else {
			k.Fail("broker.max_packet_size", "%d is too large for broker.max_queued_bytes (%d): a queued message counts its bytes twice plus 256, so a client could not receive one largest packet; use at most %d, or raise broker.max_queued_bytes", c.MaxPacketSize, n, max(0, (n-256)/2))
		}
	}
	if d := c.MaxSessionExpiry; d < 0 || d > mqttwire.MaxSessionExpiry || d%time.Second != 0 {
		k.Fail("broker.max_session_expiry", "%s is not allowed; use whole seconds from 0s to %s, such as 168h", d, mqttwire.MaxSessionExpiry)
	}
	if d := c.InflightTimeout; d < time.Second {
		k.Fail("broker.inflight_timeout", "%s is too short; use 1s or more, such as 2m", d)
	}
	if d := c.SysInterval; d < 0 || (d > 0 && d < time.Second) {
		k.Fail("broker.sys_interval", "%s is not allowed; use 1s or more, or 0s to turn $SYS off", d)
	}
	c.checkBounds(k)
	c.Login.Check(k, "broker.login")
	for i, r := range c.ACL {
		r.Check(k, fmt.Sprintf("broker.acl[%d]", i))
	}
}

// anonymousFix is what a warning about anonymous access from the network
// tells the user to do.
const anonymousFix = "set broker.allow_anonymous: false and broker.password_file (fieldgate passwd writes it), or listen on 127.0.0.1 only"

// WarnAnonymous warns, at each listener's address, when broker.allow_anonymous
// lets clients in without credentials on an address other hosts can
// reach: valid, since a trusted network may want it, but never by
// accident. A listener that requires client certificates, and a unix
// socket, admit no anonymous network client.
func WarnAnonymous(k *check.Checker, c Config, ls []Listener) {
	if !c.AllowAnonymous {
		return
	}
	for i, l := range ls {
		if !l.admitsAnonymous() {
			continue
		}
		host, _, err := net.SplitHostPort(l.Address)
		if err != nil || hostIsLoopback(host) {
			continue
		}
		where := l.Address + " is not a loopback address"
		if host == "" || net.ParseIP(host) != nil && net.ParseIP(host).IsUnspecified() {
			where = l.Address + " listens on every address of the board"
		}
		k.Warn(fmt.Sprintf("listeners[%d].address", i), "%s, and %s is on: anyone on the network can connect without credentials, read every topic and switch the outputs; %s",
			where, k.Where("broker.allow_anonymous"), anonymousFix)
	}
}

// admitsAnonymous reports whether broker.allow_anonymous lets a client
// without credentials in through this listener, wherever it listens.
func (l Listener) admitsAnonymous() bool {
	switch l.Type {
	case ListenerTCP, ListenerWS:
		return true
	case ListenerTLS, ListenerWSS:
		return l.TLS.ClientCA == "" // otherwise the handshake wants a certificate
	}
	return false
}

// examplePort is the customary port per listener type, used in hints.
var examplePort = map[ListenerType]string{
	ListenerTCP: "1883", ListenerTLS: "8883", ListenerWS: "8080", ListenerWSS: "8443",
}

// CheckListeners reports the problems of the listeners: list to k, and
// claims the sockets they bind so that no other section binds one again.
func CheckListeners(k *check.Checker, ls []Listener) {
	names := map[string]string{}
	for i, l := range ls {
		p := fmt.Sprintf("listeners[%d]", i)
		k.Name(p+".name", l.Name, names)
		l.check(k, p)
	}
}

func (l Listener) check(k *check.Checker, p string) {
	switch l.Type {
	case ListenerTCP, ListenerTLS, ListenerWS, ListenerWSS:
		if l.Address == "" {
			k.Fail(p+".address", "required: host:port, such as 127.0.0.1:%s", examplePort[l.Type])
		} else if k.HostPort(p+".address", l.Address, "127.0.0.1:"+examplePort[l.Type]) {
			k.Claim(p+".address", "tcp", l.Address)
		}
	case ListenerUnix:
		if l.Address == "" {
			k.Fail(p+".address", "required: the socket path, such as /run/fieldgate/mqtt.sock")
		} else {
			k.Claim(p+".address", "unix", l.Address)
		}
	case "":
		k.Fail(p+".type", "required: one of tcp, tls, ws, wss, unix")
	default:
		k.Fail(p+".type", "%q is not allowed; use one of tcp, tls, ws, wss, unix", l.Type)
	}

	secure := l.Type == ListenerTLS || l.Type == ListenerWSS
	if secure && l.TLS.Cert == "" {
		k.Fail(p+".tls.cert", "required for a %s listener: the PEM certificate file", l.Type)
	}
	if secure && l.TLS.Key == "" {
		k.Fail(p+".tls.key", "required for a %s listener: the PEM private key file", l.Type)
	}
	if !secure && l.Type != "" && l.TLS != (TLS{}) {
		k.Fail(p+".tls", "set, but type is %s; use type tls or wss, or remove tls", l.Type)
	}

	web := l.Type == ListenerWS || l.Type == ListenerWSS
	if !web && l.Type != "" && len(l.AllowedOrigins) > 0 {
		k.Fail(p+".allowed_origins", "set, but type is %s; only ws and wss listeners are opened by web pages; use type ws or wss, or remove allowed_origins", l.Type)
	}
	for i, o := range l.AllowedOrigins {
		if _, err := parseOrigin(o); err != nil {
			k.Fail(fmt.Sprintf("%s.allowed_origins[%d]", p, i), "%q %v; write an origin as a browser sends it, scheme://host[:port], such as https://dashboard.example.com or http://192.168.1.20:8080", o, err)
		}
	}
}
