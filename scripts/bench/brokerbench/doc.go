// Package brokerbench drives an MQTT broker over TCP and measures it side by
// side with others: messages delivered per second, delivery latency at a
// fixed rate, and the memory an idle connection or a subscription costs the
// broker process. It is the logic behind cmd/brokerload and
// bench-broker.sh.
//
// The load generator is identical for every broker and kept cheap, because
// it shares the machine with the broker it measures: plain MQTT 3.1.1 with
// clean sessions, packets encoded and decoded by mochi-mqtt's packets codec,
// one reading goroutine per connection that receives messages (none for idle
// ones), and PUBLISH packets encoded once and patched in place (packet id,
// timestamp) for every message.
//
// Scenarios (Scenarios lists them):
//
//   - throughput, qos{0,1}-PxS: P publishers send as fast as the broker takes
//     messages to S subscribers, publisher i on bench/i and subscriber i on
//     the same topic, or all on one topic for fan-out (1x1000). The figure
//     is messages received by all subscribers per second over Duration,
//     after Warmup. QoS 1 publishers keep Window PUBACKs outstanding.
//   - latency-qos{0,1}-10x10-Rmps: ten publishers send R messages per second
//     in total to ten subscribers; each payload carries its send time, and
//     the subscribers' receive times give p50, p90, p99 and max over
//     LatencyDuration.
//   - idle-Nconns-5subs: N connections, each with five subscriptions, sit
//     idle; the figure is the broker's resident set (VmRSS) after minus
//     before, per connection.
//   - subs-Cconns-Ssubs: S distinct subscriptions, 15% with wildcards, over
//     C connections; RSS after minus before, per subscription (the C
//     connections' own cost included).
//
// Each memory scenario wants a broker that has served nothing yet: a Go
// broker keeps the heap a throughput run grew, so the baseline would be
// too high. bench-broker.sh starts one for each.
//
// Memory scenarios also report the broker's own heap figure where it
// publishes one: $SYS/broker/heap/current (fieldgate; Mosquitto only when
// built with memory tracking) or $SYS/broker/system/memory (mochi).
//
// make bench-broker runs every scenario against every broker, each started
// fresh (see bench-broker.sh for its settings; QUICK=1 is a smoke run of
// under a minute). One broker by hand, from scripts/bench:
//
//	go build -o /tmp/mochiserver ./cmd/mochiserver
//	/tmp/mochiserver -addr 127.0.0.1:18832 &
//	go run ./cmd/brokerload run -broker mochi -addr 127.0.0.1:18832 -pid $! -scenarios throughput
//
// Every measurement is printed as one Go benchmark line,
//
//	BenchmarkBroker/mochi/qos0-10x10 1 123456 msgs/s 130000 sent/s 95 delivered-%
//
// so benchstat reads the raw output, and so does package report, which
// turns it into tables of medians and ratios and judges fieldgate's broker
// against its targets (cmd/benchreport).
package brokerbench
