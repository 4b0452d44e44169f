// Package gateway assembles a running fieldgate from its configuration:
// storage, the MQTT broker and its listeners, the sensor poller, the cloud
// bridge and the ops endpoint, started in that order and stopped in reverse.
//
// Components join the assembly as they are built. Today none is: Run logs
// what the configuration asks for, waits for its context to end, and logs
// the stop, so that the command line, configuration and shutdown path can be
// exercised end to end before there is anything to start.
package gateway

import (
	"context"
	"errors"
	"log/slog"

	"github.com/fieldgate/fieldgate/gateway/config"
)

// Run starts the gateway described by cfg and blocks until ctx is done; it
// returns nil after a clean shutdown.
func Run(ctx context.Context, cfg *config.Config, log *slog.Logger) error {
	if cfg == nil {
		return errors.New("gateway: run: no configuration")
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	log.Info("gateway started",
		"listeners", len(cfg.Listeners),
		"sensors", len(cfg.Sensors),
		"storage", cfg.Storage.Path,
		"assembled", "nothing yet: broker, storage, sensors and bridge are not built")
	<-ctx.Done()
	log.Info("gateway stopped", "reason", context.Cause(ctx))
	return nil
}
