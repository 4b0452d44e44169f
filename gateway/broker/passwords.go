package broker

import (
	"fmt"

	"github.com/fieldgate/fieldgate/gateway/broker/auth"
	"github.com/fieldgate/fieldgate/matcher"
)

// PasswordReload is what ReloadPasswords changed: the users by name (never
// a hash) and the clients it disconnected.
type PasswordReload struct {
	auth.Changes
	Disconnected int // clients whose login the new file no longer accepts
}

// ReloadPasswords reads the password file again and applies it at once,
// to MQTT logins and CheckPassword alike. A connected client that logged
// in with a password the new file no longer accepts (its user removed, or
// given a new password) is disconnected: with reason 0x87 (not
// authorized) in MQTT 5, by closing the connection in 3.1.1. Its session
// stays, as after any network failure, and its will is sent. A file that
// fails to parse changes nothing and returns the error. Without a password
// file it does nothing.
func (b *Broker) ReloadPasswords() (PasswordReload, error) {
	old := b.users.Load()
	if old == nil {
		return PasswordReload{}, nil
	}
	next, changes, err := old.Reload(b.opts.PasswordFile)
	if err != nil {
		return PasswordReload{}, fmt.Errorf("broker: broker.password_file: %w", err)
	}
	r := PasswordReload{Changes: changes}
	b.users.Store(next)
	if len(changes.Removed)+len(changes.Changed) == 0 {
		return r, nil
	}
	// A login under way publishes the file it was checked against before
	// it looks at b.users again (conn.checkPassword), so every login the
	// old file accepted is either seen here or checked again.
	b.lmu.Lock()
	var gone []*conn
	for c := range b.live {
		if by := c.verifiedBy.Load(); by != nil && by != next && !by.SameEntry(next, c.user) {
			gone = append(gone, c)
		}
	}
	b.lmu.Unlock()
	for _, c := range gone {
		// The client id is the reader's until CONNECT is done; the
		// remote address names the connection as well.
		b.log.Info("disconnecting a client: the reloaded password file no longer accepts its login",
			"user", c.user, "remote", c.remote)
		c.shutdown(rcNotAuthorized, "the password file no longer accepts this login")
	}
	r.Disconnected = len(gone)
	return r, nil
}

// CanPublish reports whether user (empty for an anonymous client) may
// publish to topic under the broker's current ACL, as an MQTT client of
// that user would be judged, but for rules that use %c: they name a
// client id, which a caller outside MQTT does not have, so they neither
// allow nor deny. Clients never publish to $SYS topics.
func (b *Broker) CanPublish(user, topic string) bool {
	return !matcher.IsSys(topic) && b.acl.Load().CanPublish(user, "", topic)
}
