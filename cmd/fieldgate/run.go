package main

import (
	"context"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/fieldgate/fieldgate/gateway"
	"github.com/fieldgate/fieldgate/gateway/config"
	"github.com/fieldgate/fieldgate/systemd"
)

// cmdRun runs the gateway until SIGINT or SIGTERM; SIGHUP reloads the
// configuration file.
func cmdRun(args []string, stderr io.Writer) int {
	cfg, name, code := loadConfig("run", args, stderr)
	if code != 0 {
		return code
	}

	// level changes the logger's level while it runs.
	log, level := newLogger(cfg.Log, stderr)

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// After the first signal, restore default handling so that a second
	// one kills a shutdown that hangs.
	context.AfterFunc(ctx, stop)

	inherited, err := systemd.Listeners()
	if err != nil {
		log.Error("sockets passed by systemd are unusable", "err", err)
		return exitFail
	}
	notifier := systemd.NewNotifier(log)

	// SIGHUP (systemctl reload) re-reads the file; a file with problems
	// is refused here, naming them, and the running configuration stays.
	reload := make(chan *config.Config)
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-hup:
			}
			next := cfg
			if name != config.EmbeddedName {
				var err error
				if next, err = config.Load(name); err != nil {
					log.Error("reload refused; the running configuration is kept", "config", name, "problems", err.Error())
					continue
				}
			}
			log.Info("reloading the configuration", "config", name)
			select {
			case reload <- next:
			case <-ctx.Done():
				return
			}
		}
	}()

	log.Info("fieldgate starting", "version", version, "commit", commit, "config", name, "log_level", level.Level())
	err = gateway.RunWith(ctx, cfg, log, gateway.Options{
		Version: version, Level: level, Reload: reload, Notifier: notifier, Inherited: inherited,
	})
	if err != nil {
		log.Error("fieldgate failed", "err", err)
		return exitFail
	}
	log.Info("fieldgate stopped")
	return 0
}
