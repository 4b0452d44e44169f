package broker

import (
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"net/netip"
	"strings"
	"time"

	"github.com/fieldgate/fieldgate/gateway/broker/auth"
	"github.com/fieldgate/fieldgate/internal/mqttwire"
	"github.com/fieldgate/fieldgate/matcher"
	"github.com/fieldgate/fieldgate/storage"
	"github.com/mochi-mqtt/server/v2/packets"
)

// connect reads and answers CONNECT. It reports whether the client was
// accepted; a refused client has had its CONNACK (when one is due) written.
func (c *conn) connect() bool {
	fh, body, err := c.readPacket(c.b.opts.MaxPacketSize)
	if err != nil {
		c.b.log.Debug("no CONNECT", "remote", c.remote, "err", err)
		return false
	}
	if fh.Type != packets.Connect {
		return false // [MQTT-3.1.0-1]
	}
	pk := &packets.Packet{FixedHeader: fh}
	if err := decode(pk, body); err != nil {
		// Malformed, unless the packet decoded and broke a rule: a
		// property twice, say, is a Protocol Error (MQTT 5 §2.2.2.2).
		code := byte(rcMalformed)
		var we *mqttwire.Error
		if errors.As(err, &we) && we.Code == rcProtocolError {
			code = rcProtocolError
		}
		c.refuse(pk.ProtocolVersion, code, err.Error())
		return false
	}
	c.v5 = pk.ProtocolVersion == 5
	if c.v5 {
		c.maxOut = pk.Properties.MaximumPacketSize // a refusal's CONNACK must fit too
	}
	code, why := c.checkConnect(pk)
	if code != rcSuccess {
		c.refuse(pk.ProtocolVersion, code, why)
		return false
	}
	if !c.authenticate(pk) {
		return false
	}
	return c.accept(pk)
}

// checkConnect applies the rules CONNECT must follow and returns a reason
// code and text for the first one broken.
func (c *conn) checkConnect(pk *packets.Packet) (byte, string) {
	cp := &pk.Connect
	name := string(cp.ProtocolName)
	switch {
	case name != "MQTT" && name != "MQIsdp" && !c.v5:
		// [MQTT-3.1.2-1]: 3.1.1 has no code for it; the connection closes.
		return rcProtocolError, "protocol name is not MQTT"
	case name != "MQTT" || (pk.ProtocolVersion != 4 && pk.ProtocolVersion != 5):
		// A 5.0 level with another name ([MQTT-3.1.2-1]), MQIsdp (3.1) or
		// another level: 0x84 tells the client which assumption failed.
		return rcUnsupportedVersion, "only MQTT 3.1.1 and 5.0 are served" // [MQTT-3.1.2-2]
	case pk.ReservedBit != 0:
		return rcMalformed, "reserved flag set in CONNECT" // [MQTT-3.1.2-3]
	case !cp.WillFlag && (cp.WillQos != 0 || cp.WillRetain):
		return rcMalformed, "will QoS or retain set without a will" // [MQTT-3.1.2-11] [MQTT-3.1.2-13]
	case cp.WillQos > 2:
		return rcMalformed, "will QoS 3" // [MQTT-3.1.2-12]
	case !c.v5 && cp.PasswordFlag && !cp.UsernameFlag:
		return rcMalformed, "password without a user name" // [MQTT-3.1.2-22]
	case c.v5 && pk.Properties.AuthenticationMethod != "":
		return rcBadAuthMethod, "no authentication method is supported; use a user name and password"
	}
	if cp.WillFlag {
		if err := matcher.ValidateTopic(cp.WillTopic); err != nil {
			return rcTopicNameInvalid, "will topic: " + err.Error()
		}
	}
	if cp.ClientIdentifier == "" && !c.v5 && !cp.Clean {
		return rcClientIDInvalid, "an empty client id needs clean session" // [MQTT-3.1.3-8]
	}
	return rcSuccess, ""
}

// authenticate checks the client's credentials and refuses it when they
// fail. A listener that verified a client certificate authenticates its
// client by the certificate's common name.
func (c *conn) authenticate(pk *packets.Packet) bool {
	cp := &pk.Connect
	c.user = string(cp.Username)
	if tc, ok := c.nc.(*tls.Conn); ok {
		if certs := tc.ConnectionState().VerifiedChains; len(certs) > 0 && len(certs[0]) > 0 {
			c.user = certs[0][0].Subject.CommonName
			return true
		}
	}
	if wc, ok := c.nc.(interface{ verifiedName() string }); ok {
		if n := wc.verifiedName(); n != "" {
			c.user = n
			return true
		}
	}
	switch {
	case !cp.UsernameFlag && !c.b.opts.AllowAnonymous:
		c.refuse(pk.ProtocolVersion, rcNotAuthorized, "anonymous clients are not allowed")
		return false
	case cp.UsernameFlag && c.b.users.Load() != nil:
		switch o := c.checkPassword(auth.Source(c.nc.RemoteAddr()), cp.Password); {
		case o == auth.WrongPassword:
			c.b.log.Info("bad user name or password", "user", c.user, "client", cp.ClientIdentifier, "remote", c.remote)
			c.refuse(pk.ProtocolVersion, rcBadUserPass, "bad user name or password")
			return false
		case o != auth.Accepted:
			c.b.logLoginRefused(o, c.remote, c.user)
			c.refuseUnchecked(pk.ProtocolVersion, o)
			return false
		}
	case cp.UsernameFlag && !c.b.opts.AllowAnonymous:
		// No password file: a user name proves nothing.
		c.refuse(pk.ProtocolVersion, rcBadUserPass, "no password file is configured")
		return false
	}
	return true
}

// checkPassword checks the client's password, from address from, against
// the broker's password file. A reload that replaces the file during a check must not
// let the login through under the old file, nor miss it: the connection
// publishes the file it was verified by before it looks whether the file
// is still current, and ReloadPasswords replaces the file before it looks
// at the connections, so one of the two sees the other and the login is
// checked again or disconnected.
func (c *conn) checkPassword(from netip.Addr, password []byte) auth.Outcome {
	users := c.b.users.Load()
	for {
		if o := users.CheckFrom(from, c.user, password); o != auth.Accepted {
			return o
		}
		c.verifiedBy.Store(users)
		now := c.b.users.Load()
		if now == users {
			return auth.Accepted
		}
		users = now
	}
}

// refuse writes a CONNACK with a failure code, in the client's version,
// and nothing else [MQTT-3.2.2-7]. MQTT 3.1.1 gets its own return codes;
// a malformed CONNECT gets no CONNACK in 3.1.1 [MQTT-3.1.4-1].
func (c *conn) refuse(version, code byte, why string) {
	c.b.log.Debug("connection refused", "remote", c.remote, "code", code, "why", why)
	pk := &packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Connack}, ProtocolVersion: version}
	if version == 5 {
		pk.ReasonCode = code
		pk.Properties.ReasonString = why
	} else {
		pk.ProtocolVersion = 4
		switch code {
		case rcMalformed, rcProtocolError, rcTopicNameInvalid:
			// A CONNECT that breaks the rules, an invalid will topic
			// included, is closed without a CONNACK [MQTT-3.1.4-1].
			return
		case rcUnsupportedVersion:
			pk.ReasonCode = 0x01
		case rcClientIDInvalid:
			pk.ReasonCode = 0x02
		case rcBadUserPass:
			pk.ReasonCode = 0x04
		case rcNotAuthorized:
			pk.ReasonCode = 0x05
		default:
			pk.ReasonCode = 0x03
		}
	}
	_ = c.nc.SetWriteDeadline(time.Now().Add(writeTimeout))
	_, _ = c.nc.Write(encodeWithin(pk, c.maxOut)) // [MQTT-3.2.2-19]
}

// refuseUnchecked refuses a login whose password was not checked, because
// its address failed too often or the bcrypt queue turned it away: 0x86
// in MQTT 5, as for a wrong password, with a reason string that says why;
// 0x05 (not authorized) in MQTT 3.1.1, which has no code for "not now"
// and whose 0x04 would tell a device with the right password that it is
// wrong.
func (c *conn) refuseUnchecked(version byte, o auth.Outcome) {
	why := "too many failed logins from this address; try again later"
	if o != auth.Limited {
		why = "too many logins waiting for a password check; try again later"
	}
	if version == 5 {
		c.refuse(version, rcBadUserPass, why)
		return
	}
	c.refuse(version, rcNotAuthorized, why)
}

// accept sets the connection up from CONNECT, attaches it to its session
// and queues CONNACK.
func (c *conn) accept(pk *packets.Packet) bool {
	b := c.b
	cp := &pk.Connect
	props := &pk.Properties
	ack := &packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Connack}, ProtocolVersion: pk.ProtocolVersion}

	c.clientID = cp.ClientIdentifier
	if c.clientID == "" {
		c.clientID = newClientID() // [MQTT-3.1.3-6]
		if c.v5 {
			ack.Properties.AssignedClientID = c.clientID // [MQTT-3.2.2-16]
		}
	} else {
		c.clientID = strings.Clone(c.clientID)
	}

	c.keepalive = time.Duration(cp.Keepalive) * time.Second
	if c.v5 && (cp.Keepalive == 0 || c.keepalive > b.opts.MaxKeepalive) {
		// The server's keep alive replaces the client's [MQTT-3.2.2-21].
		c.keepalive = b.opts.MaxKeepalive
		ack.Properties.ServerKeepAlive = uint16(b.opts.MaxKeepalive / time.Second)
		ack.Properties.ServerKeepAliveFlag = true
	}

	c.window = b.opts.MaxInflight
	var expiry time.Duration
	if c.v5 {
		if props.ReceiveMaximum > 0 {
			c.window = min(c.window, int(props.ReceiveMaximum))
		}
		c.maxOut = props.MaximumPacketSize
		c.aliasMax = props.TopicAliasMaximum
		c.problemOff = props.RequestProblemInfoFlag && props.RequestProblemInfo == 0
		c.askedExpiry = props.SessionExpiryInterval
		expiry = time.Duration(props.SessionExpiryInterval) * time.Second
		if expiry > b.opts.MaxSessionExpiry {
			expiry = b.opts.MaxSessionExpiry
			ack.Properties.SessionExpiryInterval = uint32(expiry / time.Second)
			ack.Properties.SessionExpiryIntervalFlag = true
		}
		ack.Properties.ReceiveMaximum = uint16(b.opts.ReceiveMaximum)
		ack.Properties.MaximumPacketSize = uint32(b.opts.MaxPacketSize)
		ack.Properties.TopicAliasMaximum = uint16(b.opts.TopicAliasMax)
		// The codec leaves out the reason string and user properties
		// when they would take the CONNACK past the client's maximum
		// [MQTT-3.2.2-19] [MQTT-3.2.2-20].
		ack.Mods.MaxSize = c.maxOut
	} else if !cp.Clean {
		// MQTT 3.1.1 sessions with clean session off never expire in
		// the protocol; the broker bounds them all the same.
		expiry = b.opts.MaxSessionExpiry
	}

	// The client's ACL rules, worked out once for its user and client id.
	perms := b.acl.Load().For(c.user, c.clientID)
	c.perms.Store(&perms)

	var w *will
	if cp.WillFlag {
		if !perms.CanPublish(cp.WillTopic) || matcher.IsSys(cp.WillTopic) {
			c.refuse(pk.ProtocolVersion, rcNotAuthorized, "not authorized to publish the will topic "+cp.WillTopic)
			return false
		}
		w = &will{topic: strings.Clone(cp.WillTopic), payload: cp.WillPayload, qos: cp.WillQos, retain: cp.WillRetain, owner: c.user}
		if c.v5 {
			wp := cp.WillProperties
			w.props = &wp
			w.delay = time.Duration(wp.WillDelayInterval) * time.Second
		}
	}

	connack := func(present bool) {
		ack.SessionPresent = present // [MQTT-3.2.2-2] [MQTT-3.2.2-3]
		c.qmu.Lock()
		c.greeted = true
		c.qmu.Unlock()
		c.enqueueControl(encodePacket(ack))
	}
	if err := b.attach(c, cp.Clean, expiry, w, connack); err != nil {
		code := byte(rcServerBusy)
		switch {
		case errors.Is(err, errReservedID):
			code = rcClientIDInvalid
		case errors.Is(err, errSessionOwner):
			code = rcNotAuthorized
		}
		if errors.Is(err, errQuota) {
			code = rcQuotaExceeded // 0x03 Server unavailable in 3.1.1: see refuse
		}
		c.refuse(pk.ProtocolVersion, code, err.Error())
		return false
	}
	b.stats.connected.Add(1)
	b.stats.totalConns.Add(1)
	c.s.pumpRetained() // a persistent session's scans go on
	return true
}

var errReservedID = errors.New("client identifier in use by the gateway itself")

// newClientID makes an identifier for a client that sent none.
func newClientID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return "fieldgate-" + hex.EncodeToString(b[:])
}

// attach binds c to its session, taking the client id over from another
// connection and starting afresh when clean is set [MQTT-3.1.2-4]; connack
// is queued before anything else can be [MQTT-3.2.0-1].
func (b *Broker) attach(c *conn, clean bool, expiry time.Duration, w *will, connack func(present bool)) error {
	var wills []*message
	b.mu.Lock()
	b.lmu.Lock()
	closed := b.closed
	b.lmu.Unlock()
	if closed {
		b.mu.Unlock()
		return ErrClosed
	}
	now := time.Now()
	old := b.sessions[c.clientID]
	if old != nil {
		old.mu.Lock()
		oc := old.conn
		if oc != nil && oc.local != nil && c.local == nil {
			// The gateway's own clients cannot be taken over from the
			// network.
			old.mu.Unlock()
			b.mu.Unlock()
			return errReservedID
		}
		// An expired session is gone even before the once-a-second sweep
		// removes it [MQTT-4.1.0-2].
		expired := oc == nil && !old.expireAt.IsZero() && !now.Before(old.expireAt)
		if !expired && old.user != c.user {
			// A session belongs to the user who made it: another user
			// taking its client id over would inherit its subscriptions
			// and queue, and a clean start would destroy them.
			owner := old.user
			old.mu.Unlock()
			b.mu.Unlock()
			b.log.Warn("connection refused: the client id belongs to another user's session", "client", c.clientID,
				"user", c.user, "owner", owner, "remote", c.remote)
			return errSessionOwner
		}
		if oc != nil {
			// Session takeover [MQTT-3.1.4-3]: the old connection's will
			// goes out unless the session lives on and its delay has not
			// passed, which it cannot have [MQTT-3.1.3-9].
			old.conn = nil
			if old.will != nil && (clean || old.will.delay == 0 || old.expiry == 0) {
				wills = append(wills, old.will.message(now))
			}
			old.will = nil
		} else if old.will != nil && (clean || expired) {
			// A will waiting for its delay goes when the session ends.
			wills = append(wills, old.will.message(now))
			old.will = nil
		}
		old.will = nil
		old.mu.Unlock()
		if oc != nil {
			b.log.Info("session taken over", "client", c.clientID, "old", oc.remote, "new", c.remote)
			oc.shutdown(rcSessionTakenOver, "")
			b.stats.connected.Add(-1)
		}
		if clean || expired || old.expiry == 0 {
			b.endSession(old)
			old = nil
		}
	}
	s := old
	if s == nil {
		if err := b.admitSession(c.clientID, c.user, expiry); err != nil {
			b.mu.Unlock()
			return err
		}
		s = &session{b: b, id: c.clientID, subs: make(map[string]subscription)}
		h, err := b.newHandle(s)
		if err != nil {
			b.mu.Unlock()
			return err
		}
		s.handle = h
		b.sessions[c.clientID] = s
	}
	s.mu.Lock()
	s.user = c.user
	s.local = c.local != nil
	s.expiry = expiry
	s.expireAt = time.Time{}
	s.will, s.willAt = w, time.Time{}
	// What a resumed session holds is checked against the rules in force
	// now, which may have changed while it was away.
	var bt storage.Batch
	dropped, unqueued := s.applyACL(b, b.acl.Load(), &bt)
	b.logACL(s, "resumed", dropped, unqueued)
	p := s.perms
	c.perms.Store(&p)
	if b.store != nil && (s.persistent(b) || s.stored || !bt.Empty()) {
		// The session's record, with its expiry and will; not waited
		// for: a crash before it is on disk loses only the session's
		// existence, which the next CONNACK's session present reports.
		if s.persistent(b) {
			bt.PutSession(s.record())
		} else {
			bt.DeleteSession(s.id)
		}
		s.stored = s.persistent(b)
		b.store.Commit(&bt, nil)
	}
	c.s = s
	connack(old != nil)
	s.conn = c
	b.index.SetOnline(s.handle, true)
	s.resend()
	s.mu.Unlock()
	b.mu.Unlock()
	for _, m := range wills {
		b.publishOwn(m)
	}
	return nil
}

// detach unbinds c from its session when the connection ends. normal is a
// DISCONNECT with reason 0, which discards the will [MQTT-3.1.2-10].
func (b *Broker) detach(c *conn, normal bool) {
	var willMsg *message
	now := time.Now()
	b.mu.Lock()
	s := c.s
	s.mu.Lock()
	if s.conn != c {
		// Taken over: the new connection has dealt with the will.
		s.mu.Unlock()
		b.mu.Unlock()
		return
	}
	s.conn = nil
	b.stats.connected.Add(-1)
	if s.will != nil {
		switch {
		case normal:
			s.will = nil
		case s.will.delay == 0 || s.expiry == 0:
			willMsg = s.will.message(now) // [MQTT-3.1.2-8]
			s.will = nil
		default:
			s.willAt = now.Add(s.will.delay) // [MQTT-3.1.3-9]
		}
	}
	end := s.expiry == 0
	if !end {
		s.expireAt = now.Add(s.expiry)
		// QoS 0 messages do not wait for a client to return.
		if s.persistent(b) {
			rec := s.record()
			b.lazy(func(bt *storage.Batch) { bt.PutSession(rec) })
		}
	}
	s.mu.Unlock()
	if end {
		b.endSession(s)
	} else {
		b.index.SetOnline(s.handle, false)
	}
	b.mu.Unlock()
	if willMsg != nil {
		b.publishOwn(willMsg)
	}
}

// message builds the will's Application Message as it is published: its
// message expiry interval counts from now.
func (w *will) message(now time.Time) *message {
	m := newMessage(w.topic, w.payload, w.qos, w.retain, w.props, now)
	m.owner = w.owner
	return m
}
