package broker

import (
	"errors"

	"github.com/fieldgate/fieldgate/gateway/broker/auth"
	"github.com/fieldgate/fieldgate/storage"
)

// Access control over what a session holds. A subscription is granted when
// its user may read some topic it matches (auth.Permissions.Subscribe); one
// that reaches topics the user may not read is Checked, and its session
// then checks every message at delivery (session.deliverLocked). A
// session belongs to the user who made it: another user cannot take its
// client identifier over (attach), so what it holds is never read by
// anyone else. Its permissions are worked out again whenever the ACL it
// was checked under has been replaced: at restore, on resume, and for
// every session at once when the rules are reloaded (SetACL).

// errSessionOwner refuses a CONNECT whose client identifier names a
// session another user made.
var errSessionOwner = errors.New("client identifier in use by another user's session")

// openPerms allow everything: the permissions of the gateway's own
// in-process clients, which no ACL restricts.
var openPerms = (*auth.ACL)(nil).For("", "")

// applyACL works the session's permissions out from acl, unless they
// already were: it drops the subscriptions the user may no longer make,
// marks those needing a check per message, gives a connected client the
// new rules for its publishes, and drops queued messages the user may no
// longer read (those in flight only while the client is away, since a
// connected client has them already). What it drops from a persistent
// session's record goes into bt. It returns the filters and the number of
// queued messages dropped. The caller holds b.mu and s.mu.
func (s *session) applyACL(b *Broker, acl *auth.ACL, bt *storage.Batch) (dropped []string, unqueued int) {
	if s.aclSeen && s.acl == acl {
		return nil, 0
	}
	s.acl, s.aclSeen = acl, true
	if s.local {
		s.perms = openPerms
	} else {
		s.perms = acl.For(s.user, s.id)
	}
	if s.conn != nil {
		p := s.perms
		s.conn.perms.Store(&p)
	}
	persistent := s.persistent(b)
	s.checked = false
	for f, sub := range s.subs {
		switch s.perms.Subscribe(f) {
		case auth.Refused:
			b.index.Unsubscribe(s.handle, f)
			delete(s.subs, f)
			if persistent || s.stored {
				bt.DeleteSub(s.id, f)
			}
			dropped = append(dropped, f)
			continue
		case auth.Checked:
			sub.checked = true
		default:
			sub.checked = false
		}
		s.subs[f] = sub
		s.checked = s.checked || sub.checked
	}
	if s.perms.Open() {
		return dropped, 0
	}
	kept := s.pending[:0]
	for _, d := range s.pending {
		if s.perms.CanRead(d.msg.topic) {
			kept = append(kept, d)
			continue
		}
		s.pendingB -= d.msg.size
		delete(s.unstored, d.seq)
		if d.seq != 0 {
			bt.Dequeue(s.id, d.seq)
		}
		unqueued++
	}
	clear(s.pending[len(kept):])
	s.pending = kept
	if len(s.pending) == 0 {
		s.pending = nil
	}
	s.shrinkGrace(b)
	if s.conn == nil {
		flights := s.inflight[:0]
		for _, f := range s.inflight {
			// A flight past PUBREC holds no message any more, and one
			// waiting for its commit is released by it.
			if f.msg == nil || f.awaiting != nil || s.perms.CanRead(f.msg.topic) {
				flights = append(flights, f)
				continue
			}
			if f.seq != 0 {
				bt.Dequeue(s.id, f.seq)
			}
			unqueued++
		}
		clear(s.inflight[len(flights):])
		s.inflight = flights
	}
	return dropped, unqueued
}

// recheck notes whether any subscription of the session needs a check per
// message, after one was removed or replaced. The caller holds s.mu.
func (s *session) recheck() {
	s.checked = false
	for _, sub := range s.subs {
		if sub.checked {
			s.checked = true
			return
		}
	}
}

// logACL says what applying new rules took from a session, if anything.
func (b *Broker) logACL(s *session, why string, dropped []string, unqueued int) {
	if len(dropped) == 0 && unqueued == 0 {
		return
	}
	b.log.Info("access rules took from a session: "+why, "client", s.id, "user", s.user,
		"subscriptions_dropped", dropped, "queued_messages_dropped", unqueued)
}

// SetACL replaces the access rules, for the clients connected now as well
// as for new ones: every session's subscriptions are checked again, those
// the new rules refuse are dropped (with a log line per client), queued
// messages its user may no longer read are dropped, and connected clients
// publish under the new rules from their next packet. It returns once the
// changes to stored sessions are on disk, or why they are not.
func (b *Broker) SetACL(rules []auth.ACLRule) error {
	acl := auth.NewACL(rules)
	var bt storage.Batch
	b.mu.Lock()
	// Under b.mu, so that a session attached meanwhile is checked under
	// the new rules either here or by attach.
	b.acl.Store(acl)
	for _, s := range b.sessions {
		s.mu.Lock()
		dropped, unqueued := s.applyACL(b, acl, &bt)
		s.mu.Unlock()
		b.logACL(s, "reloaded", dropped, unqueued)
	}
	b.mu.Unlock()
	if b.store == nil || bt.Empty() {
		return nil
	}
	return b.store.CommitWait(&bt)
}
