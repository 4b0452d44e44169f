// Package gateway assembles a running fieldgate from its configuration:
// storage, the MQTT broker and its listeners, the sensor poller, the cloud
// bridge and the ops endpoint, started in that order and stopped in reverse.
//
// Components join the assembly as they are built. Today it opens the state
// file, runs the broker on the configured listeners and polls the sensors
// into it; the bridge and the ops endpoint join in later steps.
package gateway

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/fieldgate/fieldgate/gateway/bridge"
	"github.com/fieldgate/fieldgate/gateway/broker"
	"github.com/fieldgate/fieldgate/gateway/config"
	"github.com/fieldgate/fieldgate/sensors"
	"github.com/fieldgate/fieldgate/storage"
)

// shutdownGrace bounds how long clients get to receive their DISCONNECT
// and queued messages when the gateway stops.
const shutdownGrace = 5 * time.Second

// Run starts the gateway described by cfg and blocks until ctx is done; it
// returns nil after a clean shutdown. version is reported on $SYS.
func Run(ctx context.Context, cfg *config.Config, log *slog.Logger, version string) error {
	if cfg == nil {
		return errors.New("gateway: run: no configuration")
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
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
	bridges, outbound, err := newBridges(cfg, store, log)
	if err != nil {
		return fmt.Errorf("gateway: %w", err)
	}
	b, err := broker.New(broker.Options{
		Broker: cfg.Broker, Listeners: cfg.Listeners, Version: version,
		Store: store, MaxStoredBytes: int64(cfg.Storage.MaxQueuedBytes), QueuePolicy: cfg.Storage.QueuePolicy,
		Outbound: outbound,
	}, log.With("component", "broker"))
	if err != nil {
		return fmt.Errorf("gateway: %w", err)
	}
	if err := b.Start(); err != nil {
		return fmt.Errorf("gateway: %w", err)
	}
	sctx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
	defer cancel()
	poller, cl, err := startSensors(ctx, cfg, b, log, version)
	if err != nil {
		if err := b.Shutdown(sctx); err != nil {
			log.Warn("broker shutdown incomplete", "err", err)
		}
		return fmt.Errorf("gateway: %w", err)
	}
	// The bridges outlive ctx: they are stopped after the sensors, below.
	locals, err := startBridges(context.WithoutCancel(ctx), b, bridges)
	if err != nil {
		poller.Stop(sctx)
		cl.Close()
		if err := b.Shutdown(sctx); err != nil {
			log.Warn("broker shutdown incomplete", "err", err)
		}
		return fmt.Errorf("gateway: %w", err)
	}
	log.Info("gateway started", "listeners", len(cfg.Listeners), "sensors", len(cfg.Sensors), "outputs", len(cfg.Outputs),
		"bridges", len(bridges), "storage", cfg.Storage.Path)
	<-ctx.Done()
	log.Info("gateway stopping", "reason", context.Cause(ctx))
	// The reverse of the start, but for the bridges: the sensors stop
	// first, so that the outputs' safe states and the gateway's offline
	// mark still reach the outbox and, while the link holds, the upstream.
	sctx, cancel = context.WithTimeout(context.Background(), shutdownGrace)
	defer cancel()
	poller.Stop(sctx)
	cl.Close()
	stopBridges(sctx, bridges, locals)
	if err := b.Shutdown(sctx); err != nil {
		log.Warn("broker shutdown incomplete", "err", err)
	}
	log.Info("gateway stopped")
	return nil
}

// sensorsClientID is the in-process client the sensors publish through;
// network clients cannot take it over.
const sensorsClientID = "fieldgate-sensors"

// startSensors connects the poller to the broker and starts it.
func startSensors(ctx context.Context, cfg *config.Config, b *broker.Broker, log *slog.Logger, version string) (*sensors.Poller, *broker.Client, error) {
	cl, err := b.Connect(sensorsClientID)
	if err != nil {
		return nil, nil, err
	}
	p, err := sensors.New(cfg, sensors.Options{Client: sensorClient{cl}, Log: log.With("component", "sensors"), Version: version})
	if err == nil {
		err = p.Start(ctx)
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

// newBridges prepares one bridge per configured upstream, reading each
// outbox's state, and the broker's view of them.
func newBridges(cfg *config.Config, store *storage.DB, log *slog.Logger) ([]*bridge.Bridge, []broker.Outbound, error) {
	device := sensors.DeviceName(cfg.Gateway.Name)
	var bridges []*bridge.Bridge
	var outbound []broker.Outbound
	for _, bc := range cfg.Bridges {
		br, err := bridge.New(bc, bridge.Options{
			Device: device, Store: store, Log: log.With("component", "bridge"),
			Availability: cfg.Gateway.TopicPrefix + "/" + device + "/availability",
		})
		if err != nil {
			return nil, nil, err
		}
		bridges = append(bridges, br)
		outbound = append(outbound, bridgeOutbound{br})
	}
	return bridges, outbound, nil
}

// bridgeOutbound adapts a bridge to the broker's Outbound.
type bridgeOutbound struct{ *bridge.Bridge }

func (o bridgeOutbound) Offer(m *broker.Offered, batch *storage.Batch) bool {
	return o.Bridge.Offer(m.Topic, m.Payload, m.Retain, m.From, batch)
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
