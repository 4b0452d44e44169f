package gateway

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/fieldgate/fieldgate/gateway/bridge"
	"github.com/fieldgate/fieldgate/gateway/config"
	"github.com/fieldgate/fieldgate/gateway/ops"
	"github.com/fieldgate/fieldgate/sensors"
)

// bridgeGrace is how long after the start a bridge that is not connected
// still counts as ready: the first connection, with a few retries, to an
// upstream that is there.
const bridgeGrace = time.Minute

// running is the part of a running gateway that a reload replaces, read
// by the ops endpoint from its own goroutines.
type running struct {
	mu      sync.RWMutex
	poller  *sensors.Poller
	bridges []*bridge.Bridge
}

func (r *running) set(p *sensors.Poller, bs []*bridge.Bridge) {
	r.mu.Lock()
	r.poller, r.bridges = p, bs
	r.mu.Unlock()
}

func (r *running) get() (*sensors.Poller, []*bridge.Bridge) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.poller, r.bridges
}

// startOps serves the ops endpoint on cfg.Ops.Address, when set.
func (g *gw) startOps() error {
	if g.cfg.Ops.Address == "" {
		return nil
	}
	g.ops = ops.NewFromConfig(g.cfg.Ops, g.opsSources(), g.log.With("component", "ops"))
	return g.ops.Start()
}

// opsSources shows the ops endpoint the gateway through its own view types.
func (g *gw) opsSources() ops.Sources {
	started := time.Now()
	device := sensors.DeviceName(g.cfg.Gateway.Name)
	src := ops.Sources{
		Identity: func() ops.Identity { return ops.Identity{Name: device, Version: g.opts.Version, Started: started} },
		Broker:   func() ops.BrokerStats { return ops.BrokerStats(g.b.Stats()) },
		Clients: func() []ops.Client {
			cs := g.b.Clients()
			out := make([]ops.Client, len(cs))
			for i, c := range cs {
				out[i] = ops.Client(c)
			}
			return out
		},
		Sensors: func() []ops.Sensor {
			p, _ := g.run.get()
			sts := p.Stats()
			out := make([]ops.Sensor, len(sts))
			for i, st := range sts {
				vs := make([]ops.Value, len(st.Values))
				for j, v := range st.Values {
					vs[j] = ops.Value(v)
				}
				out[i] = ops.Sensor{Name: st.Name, Kind: st.Kind, OK: st.OK, Since: st.Since, LastError: st.LastError,
					Reads: st.Reads, Failures: st.Failures, Values: vs, LastRead: st.LastRead}
			}
			return out
		},
		Outputs: func() []ops.Output {
			p, _ := g.run.get()
			outs := p.Outputs()
			out := make([]ops.Output, len(outs))
			for i, o := range outs {
				out[i] = ops.Output(o)
			}
			return out
		},
		Bridges: func() []ops.Bridge {
			_, bs := g.run.get()
			out := make([]ops.Bridge, len(bs))
			for i, br := range bs {
				out[i] = ops.Bridge(br.Stats())
			}
			return out
		},
		Storage: func() ops.StorageStats {
			st := g.store.CommitStats()
			var size int64
			if fi, err := os.Stat(g.store.Path()); err == nil {
				size = fi.Size()
			}
			return ops.StorageStats{FileBytes: size, Commits: st.Commits, CommitTime: st.Time, Failures: st.Failures, LazyLost: st.LazyLost}
		},
		Ready: func() (bool, string) {
			// Commits that fail refuse QoS 1/2 publishes and lose
			// sessions' changes: not ready until one succeeds again.
			if err := g.store.WriteError(); err != nil {
				return false, "state database writes fail: " + err.Error()
			}
			_, bs := g.run.get()
			for _, br := range bs {
				st := br.Stats()
				if st.State != bridge.StateConnected && time.Since(started) > bridgeGrace {
					why := fmt.Sprintf("bridge %s is %s since %s", st.Name, st.State, st.Since.Format(time.RFC3339))
					if st.LastError != "" {
						why += ": " + st.LastError
					}
					return false, why
				}
			}
			return true, ""
		},
		SetOutput: g.setOutput,
		Token:     g.cfg.Ops.Token,

		DeadLetters: g.deadLetters,
		RetryDeadLetters: func(name string, seqs []uint64) (int, error) {
			br, err := g.bridgeNamed(name)
			if err != nil {
				return 0, err
			}
			n, err := br.RetryDeadLetters(seqs)
			return n, opsError(err)
		},
		DropDeadLetters: func(name string, seqs []uint64) (int, error) {
			br, err := g.bridgeNamed(name)
			if err != nil {
				return 0, err
			}
			n, err := br.DropDeadLetters(seqs)
			return n, opsError(err)
		},
	}
	if g.cfg.Broker.PasswordFile != "" {
		// The broker's check: its bounds on bcrypt and on the failures of
		// an address hold for both.
		src.CheckPassword = func(remote, user, password string) bool {
			return g.b.CheckPasswordFrom(remote, user, []byte(password))
		}
		// A user switches what its MQTT clients may: the same ACL.
		src.MaySwitch = g.maySwitch
	}
	return src
}

// bridgeNamed returns the running bridge called name, or an error the
// ops endpoint answers with 404.
func (g *gw) bridgeNamed(name string) (*bridge.Bridge, error) {
	_, bs := g.run.get()
	for _, br := range bs {
		if br.Name() == name {
			return br, nil
		}
	}
	return nil, notFound{fmt.Errorf("no bridge is named %q", name)}
}

// deadLetters shows the ops endpoint a bridge's newest dead letters.
func (g *gw) deadLetters(name string, limit int) ([]ops.DeadLetter, error) {
	br, err := g.bridgeNamed(name)
	if err != nil {
		return nil, err
	}
	list, err := br.DeadLetters(limit)
	if err != nil {
		return nil, err
	}
	out := make([]ops.DeadLetter, len(list))
	for i, d := range list {
		out[i] = ops.DeadLetter{
			Seq: d.Seq, Topic: d.Entry.Msg.Topic, Reason: d.Reason, At: time.Unix(0, d.At), Failures: d.Failures,
			QoS: d.Entry.Msg.QoS, Retain: d.Entry.Msg.Retain, Queued: time.Unix(0, d.Entry.Added), Payload: d.Entry.Msg.Payload,
		}
	}
	return out, nil
}

// notFound is an error the ops endpoint answers with 404, in the words
// of the part that raised it.
type notFound struct{ err error }

func (e notFound) Error() string        { return e.err.Error() }
func (e notFound) Unwrap() error        { return e.err }
func (e notFound) Is(target error) bool { return target == ops.ErrNotFound }

// opsError marks a bridge's error for a dead letter that does not exist
// as one the ops endpoint answers with 404.
func opsError(err error) error {
	if errors.Is(err, bridge.ErrNoDeadLetter) {
		return notFound{err}
	}
	return err
}

// setOutput switches an output the way an MQTT command does: a message on
// its set topic, so the command is logged and handled in one place.
func (g *gw) setOutput(name string, on bool) error {
	cfg := g.current()
	found := false
	for _, o := range cfg.Outputs {
		found = found || o.Name == name
	}
	if !found {
		return fmt.Errorf("no output named %q", name)
	}
	payload := "OFF"
	if on {
		payload = "ON"
	}
	topic := g.outputSetTopic(name)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return g.opsClient.Publish(ctx, topic, []byte(payload), 1, false)
}

// current returns the configuration running now.
func (g *gw) current() *config.Config {
	g.cfgMu.RLock()
	defer g.cfgMu.RUnlock()
	return g.cfg
}

// opsClientID is the in-process client the status page's switch publishes
// commands through.
const opsClientID = "fieldgate-ops"
