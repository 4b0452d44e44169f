package broker

import (
	"runtime/metrics"
	"strconv"
	"time"

	"github.com/fieldgate/fieldgate/matcher"
)

// publishSys publishes the $SYS/broker/... topics, retained, so that a
// client subscribing later sees the latest figures at once. Clients cannot
// publish to $SYS topics (matcher.IsSys), and # does not match them
// [MQTT-4.7.2-1]. Other $ topics are the clients': AWS IoT's
// $aws/things/{thing}/shadow/... and Azure's $iothub/... are published
// locally for a bridge to carry upstream, stored, retained and counted
// like any topic.
func (b *Broker) publishSys(now time.Time) {
	b.mu.Lock()
	sessions := len(b.sessions)
	b.mu.Unlock()
	sample := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	metrics.Read(sample)
	var heap uint64
	if sample[0].Value.Kind() == metrics.KindUint64 {
		heap = sample[0].Value.Uint64()
	}
	st := &b.stats
	for _, kv := range []struct {
		topic string
		value string
	}{
		{"version", b.opts.Version},
		{"uptime", strconv.FormatInt(int64(now.Sub(b.start)/time.Second), 10) + " seconds"},
		{"clients/connected", itoa(st.connected.Load())},
		{"clients/total", strconv.Itoa(sessions)},
		{"clients/connections", itoa(st.totalConns.Load())},
		{"messages/received", itoa(st.msgsRecv.Load())},
		{"messages/sent", itoa(st.msgsSent.Load())},
		{"messages/dropped", itoa(st.dropped.Load())},
		{"bytes/received", itoa(st.bytesRecv.Load())},
		{"bytes/sent", itoa(st.bytesSent.Load())},
		{"subscriptions/count", strconv.Itoa(b.index.Len())},
		{"retained messages/count", strconv.Itoa(b.retained.len())},
		{"heap/current", strconv.FormatUint(heap, 10)},
	} {
		m := newMessage("$SYS/broker/"+kv.topic, []byte(kv.value), 0, true, nil, now)
		b.publish(m, matcher.NoHandle, nil)
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// Stats is a snapshot of the broker's counters, for metrics and status.
type Stats struct {
	Started       time.Time
	Connected     int64 // clients connected now, in-process ones included
	Sessions      int   // sessions held, connected or not
	Connections   int64 // connections accepted since start
	MsgsReceived  int64
	MsgsSent      int64
	BytesReceived int64
	BytesSent     int64
	Dropped       int64 // messages dropped for a full queue or an expired one
	Refused       int64 // publishes refused because a queue that never drops was full
	Withheld      int64 // deliveries withheld because the subscriber's user may not read the topic
	OriginRefused int64 // WebSocket upgrades refused because a page of another origin asked
	Subscriptions int
	Retained      int

	PersistentSessions int              // sessions counted against broker.max_persistent_sessions
	RetainedCounted    int              // retained messages counted against broker.max_retained_messages
	RetainedBytes      int64            // their bytes, as broker.max_retained_bytes counts them
	Refusals           map[string]int64 // what the broker's bounds refused, by bound
	LoginsRefused      map[string]int64 // logins refused, by reason (auth.Outcome's names); nil without a password file
}

// Stats returns the broker's counters now.
func (b *Broker) Stats() Stats {
	b.mu.Lock()
	sessions := len(b.sessions)
	b.mu.Unlock()
	st := &b.stats
	out := Stats{
		Started: b.start, Connected: st.connected.Load(), Sessions: sessions, Connections: st.totalConns.Load(),
		MsgsReceived: st.msgsRecv.Load(), MsgsSent: st.msgsSent.Load(),
		BytesReceived: st.bytesRecv.Load(), BytesSent: st.bytesSent.Load(),
		Dropped: st.dropped.Load(), Refused: st.refused.Load(), Withheld: st.withheld.Load(), OriginRefused: st.originRefused.Load(),
		Subscriptions: b.index.Len(), Retained: b.retained.len(),
		LoginsRefused: b.loginsRefused(),
	}
	b.boundStats(&out)
	return out
}

// ClientInfo is one connected network client, for the status page.
type ClientInfo struct {
	ID       string
	User     string
	Listener string
	Remote   string
	V5       bool
}

// Clients lists the network clients connected now (in-process ones are
// the gateway's own), in no particular order.
func (b *Broker) Clients() []ClientInfo {
	b.lmu.Lock()
	conns := make([]*conn, 0, len(b.live))
	for c := range b.live {
		conns = append(conns, c)
	}
	b.lmu.Unlock()
	out := make([]ClientInfo, 0, len(conns))
	for _, c := range conns {
		c.qmu.Lock()
		// The CONNACK is queued once CONNECT is accepted; the fields
		// read below are set before and never change after.
		ok := c.greeted && !c.closing
		c.qmu.Unlock()
		if ok && c.nc != nil {
			out = append(out, ClientInfo{ID: c.clientID, User: c.user, Listener: c.listener, Remote: c.remote, V5: c.v5})
		}
	}
	return out
}
