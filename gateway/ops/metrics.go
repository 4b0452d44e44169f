package ops

import (
	"bytes"
	"maps"
	"math"
	"net/http"
	"os"
	"runtime"
	"runtime/metrics"
	"slices"
	"strconv"
	"time"
)

// exposition builds a page of the Prometheus text format, version 0.0.4:
// per family a HELP and a TYPE line, then its samples, one per line, as
// name{label="value",...} value. Every family's samples are written
// together, right after its TYPE line, as the format requires.
type exposition struct {
	b []byte
}

// family starts a metric family.
func (e *exposition) family(name, typ, help string) {
	e.b = append(e.b, "# HELP "...)
	e.b = append(e.b, name...)
	e.b = append(e.b, ' ')
	e.b = appendEscaped(e.b, help, false)
	e.b = append(e.b, "\n# TYPE "...)
	e.b = append(e.b, name...)
	e.b = append(e.b, ' ')
	e.b = append(e.b, typ...)
	e.b = append(e.b, '\n')
}

// labels appends name and its labels, given as name, value pairs.
func (e *exposition) labels(name string, labels []string) {
	e.b = append(e.b, name...)
	if len(labels) == 0 {
		return
	}
	e.b = append(e.b, '{')
	for i := 0; i+1 < len(labels); i += 2 {
		if i > 0 {
			e.b = append(e.b, ',')
		}
		e.b = append(e.b, labels[i]...)
		e.b = append(e.b, `="`...)
		e.b = appendEscaped(e.b, labels[i+1], true)
		e.b = append(e.b, '"')
	}
	e.b = append(e.b, '}')
}

// float writes one sample.
func (e *exposition) float(name string, v float64, labels ...string) {
	e.labels(name, labels)
	e.b = append(e.b, ' ')
	switch {
	case math.IsNaN(v):
		e.b = append(e.b, "NaN"...)
	case math.IsInf(v, 1):
		e.b = append(e.b, "+Inf"...)
	case math.IsInf(v, -1):
		e.b = append(e.b, "-Inf"...)
	default:
		e.b = strconv.AppendFloat(e.b, v, 'g', -1, 64)
	}
	e.b = append(e.b, '\n')
}

// whole writes one sample of a whole number, exactly however large.
func (e *exposition) whole(name string, v uint64, labels ...string) {
	e.labels(name, labels)
	e.b = append(e.b, ' ')
	e.b = strconv.AppendUint(e.b, v, 10)
	e.b = append(e.b, '\n')
}

// byReason writes one sample per reason in counts, in order, each labelled
// with its owner (a sensor or a bridge) and the reason.
func (e *exposition) byReason(name, ownerLabel, owner string, counts map[string]uint64) {
	for _, reason := range sortedKeys(counts) {
		e.whole(name, counts[reason], ownerLabel, owner, "reason", reason)
	}
}

// count writes one sample of a count that cannot be negative; a negative
// one, which would be a bug upstream, is written as 0.
func (e *exposition) count(name string, v int64, labels ...string) {
	e.whole(name, uint64(max(v, 0)), labels...)
}

// appendEscaped escapes s for a HELP line (backslash and newline) or, with
// quote, for a label value (also the double quote).
func appendEscaped(b []byte, s string, quote bool) []byte {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '\\':
			b = append(b, `\\`...)
		case c == '\n':
			b = append(b, `\n`...)
		case c == '"' && quote:
			b = append(b, `\"`...)
		default:
			b = append(b, c)
		}
	}
	return b
}

// Metric types of the text format.
const (
	gauge   = "gauge"
	counter = "counter"
	summary = "summary"
)

// contentType is the text format's media type, version 0.0.4.
const contentType = "text/plain; version=0.0.4; charset=utf-8"

func (s *Server) metrics(w http.ResponseWriter, r *http.Request) {
	var e exposition
	e.b = make([]byte, 0, 16<<10)
	s.writeMetrics(&e)
	h := w.Header()
	h.Set("Content-Type", contentType)
	h.Set("Cache-Control", "no-store")
	_, _ = w.Write(e.b)
}

// writeMetrics writes every family, reading each source once.
func (s *Server) writeMetrics(e *exposition) {
	id := call(s.src.Identity)
	e.family("fieldgate_build_info", gauge, "Always 1; the labels name the gateway and its version.")
	e.float("fieldgate_build_info", 1, "device", id.Name, "version", id.Version)
	if !id.Started.IsZero() {
		e.family("fieldgate_start_time_seconds", gauge, "When the gateway started, in seconds since the Unix epoch.")
		e.float("fieldgate_start_time_seconds", unixSeconds(id.Started))
	}
	ok, _ := s.ready()
	e.family("fieldgate_ready", gauge, "1 when the gateway is ready for traffic (as /readyz answers 200), else 0.")
	e.float("fieldgate_ready", b2f(ok))

	writeBroker(e, call(s.src.Broker))
	writeStorage(e, call(s.src.Storage))
	writeSensors(e, call(s.src.Sensors))
	writeOutputs(e, call(s.src.Outputs))
	writeBridges(e, call(s.src.Bridges))
	s.writeOwn(e)
	writeRuntime(e)
}

// writeOwn writes the endpoint's own refusals.
func (s *Server) writeOwn(e *exposition) {
	e.family("fieldgate_ops_connections_limited_total", counter,
		"Connections to the ops endpoint past a limit: served by the probe lane (/healthz, /readyz; 503 otherwise), or closed at once when it was full too.")
	e.count("fieldgate_ops_connections_limited_total", s.gated.perSource.Load(), "limit", "max_conns_per_source")
	e.count("fieldgate_ops_connections_limited_total", s.gated.total.Load(), "limit", "max_conns")
	e.count("fieldgate_ops_connections_limited_total", s.gated.laneFull.Load(), "limit", "probe_lane_full")
	e.family("fieldgate_ops_refused_total", counter, "Status page and switch requests refused, by reason: wrong credentials, or a switch the ACL does not give the user.")
	e.count("fieldgate_ops_refused_total", s.refused.login.Load(), "reason", "login")
	e.count("fieldgate_ops_refused_total", s.refused.acl.Load(), "reason", "acl")
}

func writeBroker(e *exposition, b BrokerStats) {
	for _, m := range []struct {
		name, typ, help string
		v               int64
	}{
		{"fieldgate_broker_clients_connected", gauge, "Clients connected now, in-process ones included.", b.Connected},
		{"fieldgate_broker_connections_total", counter, "Network connections accepted.", b.Connections},
		{"fieldgate_broker_sessions", gauge, "Sessions held, connected or not.", int64(b.Sessions)},
		{"fieldgate_broker_subscriptions", gauge, "Subscriptions in the index.", int64(b.Subscriptions)},
		{"fieldgate_broker_retained_messages", gauge, "Retained messages held.", int64(b.Retained)},
		{"fieldgate_broker_persistent_sessions", gauge, "Persistent sessions held, as broker.max_persistent_sessions counts them.", int64(b.PersistentSessions)},
		{"fieldgate_broker_retained_bound_messages", gauge, "Retained messages clients and the gateway set, as broker.max_retained_messages counts them (no $SYS).", int64(b.RetainedCounted)},
		{"fieldgate_broker_retained_bytes", gauge, "Bytes of those retained messages, as broker.max_retained_bytes counts them.", b.RetainedBytes},
		{"fieldgate_broker_messages_received_total", counter, "PUBLISH packets received.", b.MsgsReceived},
		{"fieldgate_broker_messages_sent_total", counter, "PUBLISH packets sent.", b.MsgsSent},
		{"fieldgate_broker_received_bytes_total", counter, "Bytes received from clients.", b.BytesReceived},
		{"fieldgate_broker_sent_bytes_total", counter, "Bytes sent to clients.", b.BytesSent},
		{"fieldgate_broker_websocket_origin_refused_total", counter, "WebSocket upgrades refused with 403 because a web page of an origin the listener does not allow asked for them.", b.OriginRefused},
	} {
		e.family(m.name, m.typ, m.help)
		e.count(m.name, m.v)
	}
	// One family for every way a message is lost or turned away, so that
	// one query sums them.
	e.family("fieldgate_broker_messages_dropped_total", counter, "Messages not delivered, by reason: queue (a full or expired session queue was trimmed) refused (a queue that never drops was full, so the publish was refused) or acl (a subscription reaching topics its user may not read matched one).")
	e.count("fieldgate_broker_messages_dropped_total", b.Dropped, "reason", "queue")
	e.count("fieldgate_broker_messages_dropped_total", b.Refused, "reason", "refused")
	e.count("fieldgate_broker_messages_dropped_total", b.Withheld, "reason", "acl")
	if len(b.Refusals) > 0 {
		e.family("fieldgate_broker_bound_refusals_total", counter, "What the broker's bounds refused, by bound: persistent_sessions, persistent_sessions_per_user (CONNACK), subscriptions, filter_bytes, session_filter_bytes (SUBACK), retained, retained_per_user (a retained change not stored).")
		for _, kind := range slices.Sorted(maps.Keys(b.Refusals)) {
			e.count("fieldgate_broker_bound_refusals_total", b.Refusals[kind], "bound", kind)
		}
	}
	writeLogins(e, b.LoginsRefused)
}

// writeLogins writes the refused logins by reason; nothing without a
// password file.
func writeLogins(e *exposition, refused map[string]int64) {
	if refused == nil {
		return
	}
	e.family("fieldgate_broker_logins_refused_total", counter, "Logins refused, by reason: password (checked and wrong, or an unknown user), limited (the address failed too often lately), queue_full and queue_timeout (the bcrypt queue turned the check away); all but password without checking the password.")
	for _, reason := range slices.Sorted(maps.Keys(refused)) {
		e.count("fieldgate_broker_logins_refused_total", refused[reason], "reason", reason)
	}
}

func writeStorage(e *exposition, st StorageStats) {
	e.family("fieldgate_storage_file_bytes", gauge, "Size of the state database file.")
	e.count("fieldgate_storage_file_bytes", st.FileBytes)
	// A summary without quantiles: the sum and count give the mean commit
	// latency over any range, which is what an SD card's decline shows in.
	e.family("fieldgate_storage_commit_seconds", summary, "Time spent in state database transactions, each one fsync.")
	e.float("fieldgate_storage_commit_seconds_sum", st.CommitTime.Seconds())
	e.count("fieldgate_storage_commit_seconds_count", st.Commits)
	e.family("fieldgate_storage_commit_failures_total", counter, "State database transactions that failed.")
	e.count("fieldgate_storage_commit_failures_total", st.Failures)
	e.family("fieldgate_storage_lazy_commits_lost_total", counter, "Lazily committed batches lost because their transaction failed.")
	e.count("fieldgate_storage_lazy_commits_lost_total", st.LazyLost)
}

func writeSensors(e *exposition, sensors []Sensor) {
	if len(sensors) == 0 {
		return
	}
	e.family("fieldgate_sensor_up", gauge, "1 when the sensor's last reading succeeded.")
	for _, s := range sensors {
		e.float("fieldgate_sensor_up", b2f(s.OK), "sensor", s.Name, "kind", s.Kind)
	}
	e.family("fieldgate_sensor_reads_total", counter, "Readings published.")
	for _, s := range sensors {
		e.whole("fieldgate_sensor_reads_total", s.Reads, "sensor", s.Name)
	}
	e.family("fieldgate_sensor_failures_total", counter, "Failed readings, by reason.")
	for _, s := range sensors {
		e.byReason("fieldgate_sensor_failures_total", "sensor", s.Name, s.Failures)
	}
	e.family("fieldgate_sensor_value", gauge, "The last published value of each quantity, in its unit.")
	for _, s := range sensors {
		for _, v := range s.Values {
			e.float("fieldgate_sensor_value", v.Value, "sensor", s.Name, "quantity", v.Quantity, "unit", v.Unit)
		}
	}
	e.family("fieldgate_sensor_last_read_timestamp_seconds", gauge, "When the sensor was last read, in seconds since the Unix epoch.")
	for _, s := range sensors {
		if !s.LastRead.IsZero() {
			e.float("fieldgate_sensor_last_read_timestamp_seconds", unixSeconds(s.LastRead), "sensor", s.Name)
		}
	}
}

func writeOutputs(e *exposition, outputs []Output) {
	if len(outputs) == 0 {
		return
	}
	e.family("fieldgate_output_on", gauge, "1 when the output is on.")
	for _, o := range outputs {
		e.float("fieldgate_output_on", b2f(o.On), "output", o.Name)
	}
}

// bridgeStates are the states a bridge reports; each gets a series, so a
// state change is a change of value, not a series appearing.
var bridgeStates = []string{"connecting", "connected", "down", "stopped"}

func writeBridges(e *exposition, bridges []Bridge) {
	if len(bridges) == 0 {
		return
	}
	e.family("fieldgate_bridge_up", gauge, "1 while the bridge is connected to its upstream.")
	for _, b := range bridges {
		e.float("fieldgate_bridge_up", b2f(b.State == "connected"), "bridge", b.Name)
	}
	e.family("fieldgate_bridge_state", gauge, "1 for the bridge's current link state, 0 for the others.")
	for _, b := range bridges {
		states := bridgeStates
		if !slices.Contains(states, b.State) {
			states = append(slices.Clip(states), b.State)
		}
		for _, st := range states {
			e.float("fieldgate_bridge_state", b2f(st == b.State), "bridge", b.Name, "state", st)
		}
	}
	for _, m := range []struct {
		name, help string
		v          func(Bridge) int64
	}{
		{"fieldgate_bridge_outbox_messages", "Messages waiting in the outbox.", func(b Bridge) int64 { return int64(b.Depth) }},
		{"fieldgate_bridge_outbox_bytes", "Bytes waiting in the outbox.", func(b Bridge) int64 { return b.Bytes }},
		{"fieldgate_bridge_dead_letters", "Messages the upstream kept refusing, kept aside in the state file until retried or dropped.", func(b Bridge) int64 { return int64(b.DeadLetters) }},
		{"fieldgate_bridge_dead_letter_bytes", "Bytes of the dead letters, as max_dead_letter_bytes counts them.", func(b Bridge) int64 { return b.DeadLetterBytes }},
		{"fieldgate_bridge_failing_attempts", "Connection attempts in a row that delivered nothing (refused, or ended before an acknowledgement); 0 while the link is healthy.", func(b Bridge) int64 { return int64(b.Failing) }},
		{"fieldgate_bridge_qos_limit", "The highest QoS the bridge sends upstream: 2, unless the server's Maximum QoS or a refused QoS 2 message lowered it.", func(b Bridge) int64 { return int64(b.QoSLimit) }},
		{"fieldgate_bridge_protocol_version", "The MQTT protocol level of the current or last link: 5, or 4 for 3.1.1; 0 before the first.", func(b Bridge) int64 { return int64(b.Protocol) }},
	} {
		e.family(m.name, gauge, m.help)
		for _, b := range bridges {
			e.count(m.name, m.v(b), "bridge", b.Name)
		}
	}
	e.family("fieldgate_bridge_outbox_oldest_age_seconds", gauge, "Age of the oldest message in the outbox; 0 when it is empty.")
	for _, b := range bridges {
		e.float("fieldgate_bridge_outbox_oldest_age_seconds", b.OldestAge.Seconds(), "bridge", b.Name)
	}
	for _, m := range []struct {
		name, help string
		v          func(Bridge) uint64
	}{
		{"fieldgate_bridge_messages_sent_total", "Messages handed to the upstream link.", func(b Bridge) uint64 { return b.Sent }},
		{"fieldgate_bridge_messages_acked_total", "Messages acknowledged by the upstream.", func(b Bridge) uint64 { return b.Acked }},
		{"fieldgate_bridge_messages_inbound_total", "Upstream messages published locally.", func(b Bridge) uint64 { return b.Inbound }},
		{"fieldgate_bridge_reconnects_total", "Connections made to the upstream.", func(b Bridge) uint64 { return b.Reconnects }},
		{"fieldgate_bridge_dead_lettered_total", "Messages moved to the dead letters because the upstream kept refusing them.", func(b Bridge) uint64 { return b.DeadLettered }},
	} {
		e.family(m.name, counter, m.help)
		for _, b := range bridges {
			e.whole(m.name, m.v(b), "bridge", b.Name)
		}
	}
	e.family("fieldgate_bridge_messages_dropped_total", counter, "Outbox messages, and dead letters, dropped, by reason.")
	for _, b := range bridges {
		e.byReason("fieldgate_bridge_messages_dropped_total", "bridge", b.Name, b.Dropped)
	}
	e.family("fieldgate_bridge_inflight_window", gauge, "Messages the link may have unacknowledged: max_inflight or the upstream's Receive Maximum.")
	for _, b := range bridges {
		e.count("fieldgate_bridge_inflight_window", int64(b.Window), "bridge", b.Name)
	}
}

// runtimeSamples are read with runtime/metrics, which, unlike
// runtime.ReadMemStats, does not stop the world.
var runtimeSamples = []struct {
	key, name, typ, help string
}{
	{"/sched/goroutines:goroutines", "go_goroutines", gauge, "Goroutines that currently exist."},
	{"/memory/classes/heap/objects:bytes", "go_heap_objects_bytes", gauge, "Memory occupied by live objects and dead ones not yet swept."},
	{"/gc/heap/goal:bytes", "go_gc_heap_goal_bytes", gauge, "Heap size the garbage collector aims to finish its cycle at."},
	{"/memory/classes/total:bytes", "go_memory_mapped_bytes", gauge, "All memory the Go runtime has mapped."},
	{"/gc/cycles/total:gc-cycles", "go_gc_cycles_total", counter, "Completed garbage collection cycles."},
	{"/cpu/classes/gc/total:cpu-seconds", "go_gc_cpu_seconds_total", counter, "Estimated CPU time spent in garbage collection."},
}

func writeRuntime(e *exposition) {
	samples := make([]metrics.Sample, len(runtimeSamples))
	for i, r := range runtimeSamples {
		samples[i].Name = r.key
	}
	metrics.Read(samples)
	for i, r := range runtimeSamples {
		var v float64
		switch samples[i].Value.Kind() {
		case metrics.KindUint64:
			v = float64(samples[i].Value.Uint64())
		case metrics.KindFloat64:
			v = samples[i].Value.Float64()
		default:
			continue // not offered by this Go version
		}
		e.family(r.name, r.typ, r.help)
		e.float(r.name, v)
	}
	e.family("go_info", gauge, "Always 1; the label names the Go version the binary was built with.")
	e.float("go_info", 1, "version", runtime.Version())
	if rss, ok := residentBytes(); ok {
		e.family("process_resident_memory_bytes", gauge, "Resident set size: the RAM the process occupies.")
		e.whole("process_resident_memory_bytes", rss)
	}
}

// residentBytes reads the resident set size from /proc/self/statm; it
// reports false where there is no /proc.
func residentBytes() (uint64, bool) {
	data, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return 0, false
	}
	fields := bytes.Fields(data)
	if len(fields) < 2 {
		return 0, false
	}
	pages, err := strconv.ParseUint(string(fields[1]), 10, 64)
	if err != nil {
		return 0, false
	}
	return pages * uint64(os.Getpagesize()), true
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

func unixSeconds(t time.Time) float64 {
	return float64(t.UnixNano()) / 1e9
}

// sortedKeys returns m's keys in order, so that the page is the same for
// the same figures.
func sortedKeys(m map[string]uint64) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
