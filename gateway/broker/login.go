package broker

import (
	"time"

	"github.com/fieldgate/fieldgate/gateway/broker/auth"
)

// logLoginRefused logs a login that auth refused without checking its
// password, at most once a minute: a flood of them must not fill the
// journal, and /metrics counts every one. A wrong password is logged by
// the caller, each time: an address can make only a few of those before
// it is limited.
func (b *Broker) logLoginRefused(o auth.Outcome, remote, user string) {
	if !o.Unchecked() {
		return
	}
	b.log.Debug("login refused without a check", "reason", o.String(), "user", user, "remote", remote)
	now := time.Now().Unix()
	last := b.loginLog.Load()
	if now-last < 60 || !b.loginLog.CompareAndSwap(last, now) {
		return
	}
	l := b.opts.Login
	b.log.Warn("refusing logins without checking their passwords: addresses that failed too often, or more checks than the bcrypt queue holds; see fieldgate_broker_logins_refused_total",
		"reason", o.String(), "remote", remote, "user", user, "refused", b.auth.Refused(),
		"failures", l.Failures, "failure_interval", l.FailureInterval, "queue", l.Queue, "queue_wait", l.QueueWait)
}

// loginsRefused is Stats.LoginsRefused: nil without a password file.
func (b *Broker) loginsRefused() map[string]int64 {
	if b.auth == nil {
		return nil
	}
	return b.auth.Refused()
}
