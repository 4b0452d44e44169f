// Package gateway assembles a running fieldgate from its configuration:
// storage, the MQTT broker and its listeners, the sensor poller, the cloud
// bridge and the ops endpoint, started in that order and stopped in reverse.
//
// It is also where the parts meet: the adapters that give the bridge its
// bridge.Local on the broker, the ops endpoint its ops.Sources, and systemd
// its progress signals live here, so that no part imports another. A reload
// (SIGHUP) applies what can change live and reports what needs a restart.
package gateway

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"reflect"
	"strings"
	"sync"
	"time"

	"github.com/fieldgate/fieldgate/gateway/bridge"
	"github.com/fieldgate/fieldgate/gateway/broker"
	"github.com/fieldgate/fieldgate/gateway/config"
	"github.com/fieldgate/fieldgate/gateway/ops"
	"github.com/fieldgate/fieldgate/sensors"
	"github.com/fieldgate/fieldgate/storage"
	"github.com/fieldgate/fieldgate/systemd"
)

// shutdownGrace bounds how long clients get to receive their DISCONNECT
// and queued messages when the gateway stops.
const shutdownGrace = 5 * time.Second

// Options is what RunWith needs besides the configuration.
type Options struct {
	Version string         // reported on $SYS and in discovery
	Level   *slog.LevelVar // the logger's level, set anew when a reload changes log.level
	// Reload delivers configurations to apply while running (SIGHUP);
	// each is checked already. What cannot change live is reported.
	Reload <-chan *config.Config
	// Reloaded, when set, is told the outcome of each reload: the keys
	// applied, the keys that need a restart, and an error when the new
	// configuration was refused and the running one kept.
	Reloaded func(applied, restart []string, err error)
	// Notifier tells systemd READY, STATUS, RELOADING, STOPPING and the
	// watchdog's pings; nil (or one without NOTIFY_SOCKET) does nothing.
	Notifier *systemd.Notifier
	// Inherited are the sockets systemd passed, by name, which replace the
	// configured listeners of the same name.
	Inherited map[string]net.Listener
}

// Run starts the gateway described by cfg and blocks until ctx is done; it
// returns nil after a clean shutdown. version is reported on $SYS.
func Run(ctx context.Context, cfg *config.Config, log *slog.Logger, version string) error {
	return RunWith(ctx, cfg, log, Options{Version: version})
}

// gw is a running gateway: what RunWith started, for reloads and shutdown.
type gw struct {
	cfg     *config.Config
	log     *slog.Logger
	opts    Options
	ctx     context.Context
	store   *storage.DB
	b       *broker.Broker
	poller  *sensors.Poller
	cl      *broker.Client // the sensors' client
	bridges []*bridge.Bridge
	locals  []*broker.Client // the bridges' clients, in the same order

	beats map[string]*systemd.Beat // by component, kept across reloads

	cfgMu     sync.RWMutex // guards cfg for the ops endpoint's goroutines
	run       running      // what the ops endpoint reads
	ops       *ops.Server  // nil without ops.address
	opsClient *broker.Client
}

// RunWith is Run with options: reloads while running, and the log level.
func RunWith(ctx context.Context, cfg *config.Config, log *slog.Logger, opts Options) error {
	if cfg == nil {
		return errors.New("gateway: run: no configuration")
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if err := checkFiles(cfg); err != nil {
		return fmt.Errorf("gateway: %w", err)
	}
	store, err := storage.Open(cfg.Storage.Path, storage.Options{Logger: log.With("component", "storage")})
	if err != nil {
		return fmt.Errorf("gateway: storage.path: %w", err)
	}
	defer func() {
		if err := store.Close(); err != nil {
			log.Error("closing the state database", "err", err)
		}
	}()
	g := &gw{cfg: cfg, log: log, opts: opts, ctx: ctx, store: store, beats: map[string]*systemd.Beat{}}
	bridges, outbound, err := g.newBridges(cfg, cfg.Bridges)
	if err != nil {
		return fmt.Errorf("gateway: %w", err)
	}
	g.bridges = bridges
	g.b, err = broker.New(broker.Options{
		Config: cfg.Broker, Listeners: cfg.Listeners, Version: opts.Version,
		Store: store, MaxStoredBytes: int64(cfg.Storage.MaxQueuedBytes), QueuePolicy: cfg.Storage.QueuePolicy,
		Outbound: outbound, Inherited: opts.Inherited, Alive: g.beat("broker", 10*time.Second).Alive,
	}, log.With("component", "broker"))
	if err != nil {
		return fmt.Errorf("gateway: %w", err)
	}
	if err := g.b.Start(); err != nil {
		return fmt.Errorf("gateway: %w", err)
	}
	sctx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
	defer cancel()
	g.poller, g.cl, err = g.startSensors(cfg)
	if err != nil {
		if err := g.b.Shutdown(sctx); err != nil {
			log.Warn("broker shutdown incomplete", "err", err)
		}
		return fmt.Errorf("gateway: %w", err)
	}
	// The bridges outlive ctx: they are stopped after the sensors, below.
	g.locals, err = startBridges(context.WithoutCancel(ctx), g.b, bridges)
	if err != nil {
		g.poller.Stop(sctx)
		g.cl.Close()
		if err := g.b.Shutdown(sctx); err != nil {
			log.Warn("broker shutdown incomplete", "err", err)
		}
		return fmt.Errorf("gateway: %w", err)
	}
	g.run.set(g.poller, g.bridges)
	if err := g.startOpsClient(); err != nil {
		g.stop(sctx)
		return fmt.Errorf("gateway: %w", err)
	}
	log.Info("gateway started", "listeners", len(cfg.Listeners), "sensors", len(cfg.Sensors), "outputs", len(cfg.Outputs),
		"bridges", len(bridges), "ops", cfg.Ops.Address, "storage", cfg.Storage.Path)
	// Storage is open and every listener bound: ready.
	g.notify(opts.Notifier.Ready())
	g.status()
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	go opts.Notifier.RunWatchdog(wctx)
	statusTick := time.NewTicker(10 * time.Second)
	defer statusTick.Stop()
	for done := false; !done; {
		select {
		case <-ctx.Done():
			done = true
		case <-statusTick.C:
			g.status()
		case next := <-opts.Reload:
			g.notify(opts.Notifier.Reloading())
			applied, restart, err := g.reload(next)
			g.notify(opts.Notifier.Ready())
			g.status()
			switch {
			case err != nil:
				log.Error("reload refused; the running configuration is kept", "err", err)
			case len(restart) > 0:
				log.Warn("configuration reloaded; some changes need a restart", "applied", applied, "restart", restart)
			default:
				log.Info("configuration reloaded", "applied", applied)
			}
			if opts.Reloaded != nil {
				opts.Reloaded(applied, restart, err)
			}
		}
	}
	log.Info("gateway stopping", "reason", context.Cause(ctx))
	g.notify(opts.Notifier.Stopping())
	sctx, cancel = context.WithTimeout(context.Background(), shutdownGrace)
	defer cancel()
	g.stop(sctx)
	log.Info("gateway stopped")
	return nil
}

// startOpsClient connects the client the status page's switch uses and
// serves the ops endpoint.
func (g *gw) startOpsClient() error {
	if g.cfg.Ops.Address == "" {
		return nil
	}
	cl, err := g.b.Connect(opsClientID)
	if err != nil {
		return err
	}
	g.opsClient = cl
	return g.startOps()
}

// stop shuts down what runs, in the reverse of the start, but for the
// bridges: the sensors stop first, so that the outputs' safe states and
// the gateway's offline mark still reach the outbox and, while the link
// holds, the upstream.
func (g *gw) stop(ctx context.Context) {
	if g.ops != nil {
		if err := g.ops.Shutdown(ctx); err != nil {
			g.log.Warn("ops endpoint shutdown incomplete", "err", err)
		}
	}
	if g.opsClient != nil {
		g.opsClient.Close()
	}
	g.poller.Stop(ctx)
	g.cl.Close()
	stopBridges(ctx, g.bridges, g.locals)
	if err := g.b.Shutdown(ctx); err != nil {
		g.log.Warn("broker shutdown incomplete", "err", err)
	}
}

// reload applies next where it can change live: the password file (read
// again at every reload, as fieldgate passwd expects), the log level, the ACL,
// the sensors and outputs (the poller restarts with them), and the
// bridges (reconfigured, added or stopped). Everything else is listed as
// needing a restart. A part that fails to apply leaves that part as it
// was and returns the error.
func (g *gw) reload(next *config.Config) (applied, restart []string, err error) {
	defer func() { g.run.set(g.poller, g.bridges) }()
	cur := g.cfg
	differs := func(a, b any) bool { return !reflect.DeepEqual(a, b) }
	if differs(cur.Storage, next.Storage) {
		restart = append(restart, "storage")
	}
	if differs(cur.Listeners, next.Listeners) {
		restart = append(restart, "listeners")
	}
	if differs(cur.Ops, next.Ops) {
		restart = append(restart, "ops")
	}
	if cur.Log.Format != next.Log.Format {
		restart = append(restart, "log.format")
	}
	bc, nb := cur.Broker, next.Broker
	bc.ACL, nb.ACL = nil, nil
	if differs(bc, nb) {
		restart = append(restart, "broker")
	}
	if cur.Gateway.Name != next.Gateway.Name && len(next.Bridges) > 0 {
		restart = append(restart, "gateway.name (for the bridges' {device})")
	}

	if g.reloadPasswords() {
		applied = append(applied, "broker.password_file")
	}
	if cur.Log.Level != next.Log.Level && g.opts.Level != nil {
		g.opts.Level.Set(next.Log.SlogLevel())
		applied = append(applied, "log.level")
	}
	if differs(cur.Broker.ACL, next.Broker.ACL) {
		// The rules apply at once to every session, connected or not;
		// a failure to store what they took is reported, and what is in
		// memory already follows the new rules.
		if err := g.b.SetACL(next.Broker.ACL); err != nil {
			return applied, restart, fmt.Errorf("broker.acl: storing the sessions' dropped subscriptions: %w", err)
		}
		applied = append(applied, "broker.acl")
	}
	if differs(cur.Sensors, next.Sensors) || differs(cur.Outputs, next.Outputs) || differs(cur.Gateway, next.Gateway) {
		if err := g.restartSensors(next); err != nil {
			return applied, restart, err
		}
		applied = append(applied, "sensors", "outputs")
	}
	if differs(cur.Bridges, next.Bridges) {
		if err := g.reloadBridges(next); err != nil {
			return applied, restart, err
		}
		applied = append(applied, "bridges")
	}
	g.cfgMu.Lock()
	g.cfg = next
	g.cfgMu.Unlock()
	return applied, restart, nil
}

// restartSensors stops the poller (its outputs go to their safe state)
// and starts one on next; if that fails, the old configuration runs again.
func (g *gw) restartSensors(next *config.Config) error {
	sctx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
	defer cancel()
	g.poller.Stop(sctx)
	g.cl.Close()
	p, cl, err := g.startSensors(next)
	if err != nil {
		p, cl, err2 := g.startSensors(g.cfg)
		if err2 != nil {
			return fmt.Errorf("sensors: %w; and the previous configuration failed again: %v", err, err2)
		}
		g.poller, g.cl = p, cl
		return fmt.Errorf("sensors: %w", err)
	}
	g.poller, g.cl = p, cl
	return nil
}

// reloadBridges reconfigures the bridges that stay, starts new ones and
// stops removed ones; a removed bridge's outbox stays in the state file.
func (g *gw) reloadBridges(next *config.Config) error {
	byName := map[string]int{}
	for i, br := range g.bridges {
		byName[br.Name()] = i
	}
	// Check every change before applying any.
	var fresh []bridge.Config
	for _, bc := range next.Bridges {
		if _, ok := byName[bc.Name]; !ok {
			fresh = append(fresh, bc)
		}
	}
	added, _, err := g.newBridges(next, fresh)
	if err != nil {
		return err
	}
	var bridges []*bridge.Bridge
	var locals []*broker.Client
	keep := map[string]bool{}
	for _, bc := range next.Bridges {
		i, ok := byName[bc.Name]
		if !ok {
			continue
		}
		if err := g.bridges[i].Reconfigure(bc); err != nil {
			return err
		}
		keep[bc.Name] = true
		bridges = append(bridges, g.bridges[i])
		locals = append(locals, g.locals[i])
	}
	newLocals, err := startBridges(context.WithoutCancel(g.ctx), g.b, added)
	if err != nil {
		return err
	}
	bridges = append(bridges, added...)
	locals = append(locals, newLocals...)
	outbound := make([]broker.Outbound, len(bridges))
	for i, br := range bridges {
		outbound[i] = bridgeOutbound{br}
	}
	g.b.SetOutbound(outbound)
	for i, br := range g.bridges {
		if !keep[br.Name()] {
			g.log.Info("bridge removed; its outbox stays in the state file", "bridge", br.Name())
			br.Stop()
			g.locals[i].Close()
			g.opts.Notifier.Forget(g.beats["bridge "+br.Name()])
			delete(g.beats, "bridge "+br.Name())
		}
	}
	g.bridges, g.locals = bridges, locals
	return nil
}

// sensorsClientID is the in-process client the sensors publish through;
// network clients cannot take it over.
const sensorsClientID = "fieldgate-sensors"

// startSensors connects the poller to the broker and starts it.
func (g *gw) startSensors(cfg *config.Config) (*sensors.Poller, *broker.Client, error) {
	cl, err := g.b.Connect(sensorsClientID)
	if err != nil {
		return nil, nil, err
	}
	var alive func()
	if len(cfg.Sensors) > 0 {
		// A sensor's loop goes round at least once per interval, or per
		// backoff while it fails, plus the read's tries.
		quiet := time.Duration(0)
		for _, s := range cfg.Sensors {
			quiet = max(quiet, max(s.Interval, s.MaxBackoff)+time.Duration(s.Retries+1)*s.Timeout)
		}
		alive = g.beat("sensors", quiet+30*time.Second).Alive
	}
	p, err := sensors.New(cfg.SensorsConfig(), sensors.Options{Client: sensorClient{cl}, Log: g.log.With("component", "sensors"), Version: g.opts.Version, Alive: alive})
	if err == nil {
		err = p.Start(g.ctx)
	}
	if err != nil {
		cl.Close()
		return nil, nil, err
	}
	return p, cl, nil
}

// sensorClient adapts the broker's in-process client to sensors.Client.
type sensorClient struct{ *broker.Client }

func (c sensorClient) Subscribe(filter string, qos byte, h func(topic string, payload []byte, retained bool)) error {
	return c.Client.Subscribe(filter, qos, func(m broker.Message) { h(m.Topic, m.Payload, m.Retain) })
}

// newBridges prepares the bridges bcs of cfg, reading each outbox's state,
// and the broker's view of them.
func (g *gw) newBridges(cfg *config.Config, bcs []bridge.Config) ([]*bridge.Bridge, []broker.Outbound, error) {
	device := sensors.DeviceName(cfg.Gateway.Name)
	var bridges []*bridge.Bridge
	var outbound []broker.Outbound
	for _, bc := range bcs {
		// Dialling may take up to ack_timeout without a turn of the loop.
		beat := g.beat("bridge "+bc.Name, bc.AckTimeout+30*time.Second)
		br, err := bridge.New(bc, bridge.Options{
			Device: device, Store: g.store, Log: g.log.With("component", "bridge"),
			Availability: cfg.Gateway.TopicPrefix + "/" + device + "/availability",
			Alive:        beat.Alive,
		})
		if err != nil {
			return nil, nil, err
		}
		bridges = append(bridges, br)
		outbound = append(outbound, bridgeOutbound{br})
	}
	return bridges, outbound, nil
}

// beat returns the watchdog beat of a component, registering it once: a
// reload's new poller or bridge keeps the same one.
func (g *gw) beat(name string, maxSilence time.Duration) *systemd.Beat {
	if b, ok := g.beats[name]; ok {
		return b
	}
	b := g.opts.Notifier.Beat(name, maxSilence)
	g.beats[name] = b
	return b
}

// notify logs a failed sd_notify; systemd is told again at the next change.
func (g *gw) notify(err error) {
	if err != nil {
		g.log.Warn("telling systemd failed", "err", err)
	}
}

// status sends systemd a one-line summary for `systemctl status`.
func (g *gw) status() {
	if !g.opts.Notifier.Enabled() {
		return
	}
	bs := g.b.Stats()
	p, bridges := g.run.get()
	ok, failing := 0, 0
	for _, st := range p.Stats() {
		if st.OK {
			ok++
		} else {
			failing++
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%d clients, sensors %d ok/%d failing", bs.Connected, ok, failing)
	for _, br := range bridges {
		st := br.Stats()
		fmt.Fprintf(&b, ", bridge %s %s (outbox %d)", st.Name, st.State, st.Depth)
	}
	g.notify(g.opts.Notifier.Status(b.String()))
}

// bridgeOutbound adapts a bridge to the broker's Outbound.
type bridgeOutbound struct{ *bridge.Bridge }

// Offer turns the bridge's refusals into the broker's: a topic the
// upstream's rules refuse (0x90 to an MQTT 5 publisher), or a full alarm
// outbox (0x97).
func (o bridgeOutbound) Offer(m *broker.Offered, batch *storage.Batch) error {
	switch err := o.Bridge.Offer(m.Topic, m.Payload, m.Retain, m.From, batch); {
	case err == nil:
		return nil
	case errors.Is(err, bridge.ErrTopicRules):
		return fmt.Errorf("%w: %w", broker.ErrTopicRefused, err)
	default:
		return fmt.Errorf("%w: %w", broker.ErrQueueFull, err)
	}
}

// startBridges gives each bridge its in-process client and starts it.
func startBridges(ctx context.Context, b *broker.Broker, bridges []*bridge.Bridge) ([]*broker.Client, error) {
	var locals []*broker.Client
	for _, br := range bridges {
		cl, err := b.Connect(br.LocalID())
		if err != nil {
			for i, started := range bridges[:len(locals)] {
				started.Stop()
				locals[i].Close()
			}
			return nil, fmt.Errorf("bridge %s: %w", br.Name(), err)
		}
		locals = append(locals, cl)
		br.Start(ctx, cl)
	}
	return locals, nil
}

// stopBridges waits briefly for the outboxes to drain while the links hold,
// then closes them; what is left stays queued for the next start.
func stopBridges(ctx context.Context, bridges []*bridge.Bridge, locals []*broker.Client) {
	for _, br := range bridges {
		br.Drain(ctx, time.Second)
	}
	for i, br := range bridges {
		br.Stop()
		locals[i].Close()
	}
}
