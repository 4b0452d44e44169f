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
	b, err := broker.New(broker.Options{
		Broker: cfg.Broker, Listeners: cfg.Listeners, Version: version,
		Store: store, MaxStoredBytes: int64(cfg.Storage.MaxQueuedBytes), QueuePolicy: cfg.Storage.QueuePolicy,
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
	log.Info("gateway started", "listeners", len(cfg.Listeners), "sensors", len(cfg.Sensors), "outputs", len(cfg.Outputs), "storage", cfg.Storage.Path)
	<-ctx.Done()
	log.Info("gateway stopping", "reason", context.Cause(ctx))
	// The reverse of the start: outputs to their safe state and the
	// gateway marked offline while the broker can still carry it.
	sctx, cancel = context.WithTimeout(context.Background(), shutdownGrace)
	defer cancel()
	poller.Stop(sctx)
	cl.Close()
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
