package broker

import (
	"runtime/metrics"
	"strconv"
	"time"

	"github.com/fieldgate/fieldgate/matcher"
)

// publishSys publishes the $SYS/broker/... topics, retained, so that a
// client subscribing later sees the latest figures at once. Clients cannot
// publish to $ topics, and # does not match them [MQTT-4.7.2-1].
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
