package bridge

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"net"
	"os"
	"reflect"
	"strings"
	"time"

	"github.com/fieldgate/fieldgate/gateway/bridge/mqttclient"
	"github.com/fieldgate/fieldgate/matcher"
)

// New prepares a bridge: it compiles the routes and reads the outbox's
// counters from storage; it connects nothing until Start.
func New(cfg Config, opts Options) (*Bridge, error) {
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	outs, ins, err := compileRoutes(cfg, opts.Device)
	if err != nil {
		return nil, err
	}
	if cfg.Protocol == "3.1.1" {
		if a, b := overlapping(ins); a != nil {
			return nil, fmt.Errorf("bridge %s: in[%d] (%s) and in[%d] (%s) overlap, and MQTT 3.1.1 has no subscription identifiers to tell their messages apart; make the filters disjoint or use protocol 5",
				cfg.Name, a.index, a.filter, b.index, b.filter)
		}
	}
	ob, err := newOutbox(opts.Store, cfg.Name, int64(cfg.MaxOutboxBytes), cfg.MaxOutboxAge, outs)
	if err != nil {
		return nil, fmt.Errorf("bridge %s: outbox: %w", cfg.Name, err)
	}
	b := &Bridge{name: cfg.Name, opts: opts, log: opts.Log.With("bridge", cfg.Name), ob: ob, flights: newFlightTable()}
	b.shared.state = StateStopped
	b.loop.maxQoS = 2
	rt, err := b.compile(cfg, outs, ins)
	if err != nil {
		return nil, err
	}
	b.rt.Store(rt)
	if n := ob.count; n > 0 {
		b.log.Info("outbox holds messages from before", "messages", n, "bytes", ob.bytes)
	}
	if err := b.loadFlights(); err != nil {
		return nil, fmt.Errorf("bridge %s: %w", cfg.Name, err)
	}
	if err := b.loadDeadLetters(int64(cfg.MaxDeadLetterBytes)); err != nil {
		return nil, fmt.Errorf("bridge %s: %w", cfg.Name, err)
	}
	return b, nil
}

// compile builds the routing of cfg: the client's options, with the will
// when an out-route carries the availability topic.
func (b *Bridge) compile(cfg Config, outs []outRoute, ins []inRoute) (*routing, error) {
	copts, err := clientOptions(cfg, b.opts.Device)
	if err != nil {
		return nil, err
	}
	rt := &routing{cfg: cfg, outs: outs, ins: ins, copts: copts}
	rt.copts.OnMessage = b.onMessage
	rt.copts.Received = &b.received
	if b.opts.Store != nil {
		rt.copts.OnPubrec = b.onPubrec
	}
	if a := b.opts.Availability; a != "" {
		for i := range outs {
			if matcher.Matches(outs[i].filter, a) {
				if remote, ok := outs[i].topic.render(a); ok {
					rt.online, rt.remote = &outs[i], remote
					rt.copts.Will = &mqttclient.Will{Topic: remote, Payload: []byte("offline"), QoS: 1, Retain: true}
				}
				break
			}
		}
	}
	return rt, nil
}

// Reconfigure applies a changed configuration of the same bridge (a
// reload): routes and budgets take effect at once; when the link's own
// settings or the in-routes changed, the link is replaced, and in-route
// filters no longer configured are unsubscribed upstream. The outbox and
// what it holds are kept; queued entries keep the class of the route
// index they were queued under.
func (b *Bridge) Reconfigure(cfg Config) error {
	outs, ins, err := compileRoutes(cfg, b.opts.Device)
	if err != nil {
		return err
	}
	if cfg.Protocol == "3.1.1" {
		if x, y := overlapping(ins); x != nil {
			return fmt.Errorf("bridge %s: in[%d] (%s) and in[%d] (%s) overlap, and MQTT 3.1.1 has no subscription identifiers to tell their messages apart", cfg.Name, x.index, x.filter, y.index, y.filter)
		}
	}
	rt, err := b.compile(cfg, outs, ins)
	if err != nil {
		return err
	}
	old := b.rt.Load()
	b.ob.configure(int64(cfg.MaxOutboxBytes), cfg.MaxOutboxAge, int64(cfg.MaxDeadLetterBytes), outs)
	relink := !sameLink(old.cfg, cfg)
	var stale []string
	for _, o := range old.ins {
		found := false
		for _, n := range ins {
			found = found || n.filter == o.filter
		}
		if !found {
			stale = append(stale, o.filter)
		}
	}
	replace := relink || len(stale) > 0 || len(old.ins) != len(ins)
	b.shared.mu.Lock()
	b.rt.Store(rt)
	var c *mqttclient.Client
	if relink {
		// Another server, or settings that may fix what made this one
		// refuse: what was learned of it is forgotten.
		b.shared.learned = learned{}
	}
	if replace {
		b.shared.relinks++
		b.shared.stale = append(b.shared.stale, stale...)
		c = b.shared.client
	}
	b.shared.mu.Unlock()
	if c != nil {
		b.log.Info("bridge reconfigured; replacing the link")
		_ = c.Close()
	}
	return nil
}

// sameLink reports whether two configurations connect the same way and
// subscribe the same in-routes.
func sameLink(a, b Config) bool {
	a.Out, b.Out = nil, nil
	a.MaxOutboxBytes, b.MaxOutboxBytes = 0, 0
	a.MaxOutboxAge, b.MaxOutboxAge = 0, 0
	a.MaxDeadLetterBytes, b.MaxDeadLetterBytes = 0, 0
	a.DeadLetterAfter, b.DeadLetterAfter = 0, 0
	a.Rate, b.Rate = 0, 0
	a.TopicRules, b.TopicRules = TopicRules{}, TopicRules{}
	return reflect.DeepEqual(a, b)
}

// clientOptions turns the configuration into the upstream client's options.
func clientOptions(c Config, device string) (mqttclient.Options, error) {
	o := mqttclient.Options{
		Address: c.Address, ClientID: c.ClientID, Username: c.Username,
		KeepAlive: c.KeepAlive, SessionExpiry: c.SessionExpiry, ConnectTimeout: c.AckTimeout,
		AckTimeout: c.AckTimeout, MaxInflight: c.MaxInflight,
	}
	if o.ClientID == "" {
		o.ClientID = "fieldgate-" + device + "-" + c.Name
	}
	switch c.Protocol {
	case "5":
		o.Protocol = 5
	case "3.1.1":
		o.Protocol = 4
	}
	o.Password = []byte(c.Password)
	if c.PasswordFile != "" {
		data, err := os.ReadFile(c.PasswordFile)
		if err != nil {
			return o, fmt.Errorf("bridge %s: password_file: %w", c.Name, err)
		}
		line, _, _ := strings.Cut(string(data), "\n")
		o.Password = []byte(strings.TrimRight(line, "\r"))
	}
	if c.TLS.Enabled {
		host, _, err := net.SplitHostPort(c.Address)
		if err != nil {
			return o, fmt.Errorf("bridge %s: address: %w", c.Name, err)
		}
		tc := &tls.Config{ServerName: host, MinVersion: tls.VersionTLS12}
		if c.TLS.ServerName != "" {
			tc.ServerName = c.TLS.ServerName
		}
		if c.TLS.CAFile != "" {
			pem, err := os.ReadFile(c.TLS.CAFile)
			if err != nil {
				return o, fmt.Errorf("bridge %s: tls.ca_file: %w", c.Name, err)
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				return o, fmt.Errorf("bridge %s: tls.ca_file %s holds no PEM certificate", c.Name, c.TLS.CAFile)
			}
			tc.RootCAs = pool
		}
		if c.TLS.Cert != "" {
			cert, err := tls.LoadX509KeyPair(c.TLS.Cert, c.TLS.Key)
			if err != nil {
				return o, fmt.Errorf("bridge %s: tls.cert and tls.key: %w", c.Name, err)
			}
			tc.Certificates = []tls.Certificate{cert}
		}
		o.TLS = tc
	}
	return o, nil
}

// Start connects to the upstream and keeps connected until Stop; local
// publishes inbound messages.
func (b *Bridge) Start(ctx context.Context, local Local) {
	ctx, b.cancel = context.WithCancel(ctx)
	b.local = local
	b.wg.Add(2)
	go func() {
		defer b.wg.Done()
		b.run(ctx)
	}()
	go func() {
		defer b.wg.Done()
		b.expireLoop(ctx)
	}()
}

// Stop closes the upstream connection and waits for the bridge's
// goroutines. What is queued stays in the outbox for the next start.
func (b *Bridge) Stop() {
	if b.cancel == nil {
		return
	}
	b.cancel()
	b.wg.Wait()
	b.setState(StateStopped, nil)
}

// Drain waits up to d (and within ctx) for the outbox to be sent and
// acknowledged while the link is up; at shutdown it lets the last
// messages, such as the gateway's offline mark, go before the link closes.
func (b *Bridge) Drain(ctx context.Context, d time.Duration) {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		b.shared.mu.Lock()
		up := b.shared.state == StateConnected
		b.shared.mu.Unlock()
		b.ob.mu.Lock()
		empty := b.ob.count == 0 && len(b.ob.memory) == 0
		b.ob.mu.Unlock()
		if !up || empty {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (b *Bridge) expireLoop(ctx context.Context) {
	t := time.NewTicker(time.Minute)
	defer t.Stop()
	for {
		b.ob.expire(time.Now())
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
