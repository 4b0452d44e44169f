package gateway

import (
	"github.com/fieldgate/fieldgate/sensors"
)

// reloadPasswords reads the broker's password file again and logs what
// changed, by username only. A file that fails to parse is logged and the
// running users stay: a typo must not lock every device out. It reports
// whether anything changed.
func (g *gw) reloadPasswords() bool {
	r, err := g.b.ReloadPasswords()
	if err != nil {
		g.log.Error("password file not reloaded; the running users are kept", "file", g.cfg.Broker.PasswordFile, "err", err)
		return false
	}
	if r.Empty() {
		return false
	}
	g.log.Info("password file reloaded", "file", g.cfg.Broker.PasswordFile,
		"added", r.Added, "removed", r.Removed, "password_changed", r.Changed, "clients_disconnected", r.Disconnected)
	return true
}

// outputSetTopic is the topic an output's commands arrive on.
func (g *gw) outputSetTopic(name string) string {
	cfg := g.current()
	return cfg.Gateway.TopicPrefix + "/" + sensors.DeviceName(cfg.Gateway.Name) + "/" + name + "/set"
}

// maySwitch reports whether an MQTT user may switch an output from the ops
// endpoint: the publish permission on its set topic that the broker's
// current ACL gives the user's MQTT clients.
func (g *gw) maySwitch(user, output string) bool {
	return g.b.CanPublish(user, g.outputSetTopic(output))
}
