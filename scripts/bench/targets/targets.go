// Package targets holds every pass/fail target that fieldgate is judged
// against in its side-by-side benchmarks, in this one file, which
// docs/BENCHMARKS.md cites. Package report reads them to judge the results;
// nothing else decides what passes.
//
// A ratio target is met when fieldgate's figure divided by the peer's, taken
// the way round that puts fieldgate ahead above 1 (fieldgate ÷ peer for
// rates, peer ÷ fieldgate for times and bytes), is at least the constant. A
// limit is met when fieldgate's own figure is at most the constant.
package targets

// The subscription index (bench-matcher.sh) against mochi-mqtt's
// TopicsIndex and the NATS server's sublist, judged on every workload row
// of every GOARCH measured.
const (
	// MatchSpeedVsMochi is mochi ns/op ÷ fieldgate ns/op: an index that
	// matches a publish topic by a handful of hash lookups should leave a
	// trie with a map and a mutex per level far behind.
	MatchSpeedVsMochi = 10.0
	// MatchSpeedVsNATS is NATS ns/op ÷ fieldgate ns/op; the NATS sublist
	// is the faster of the two peers.
	MatchSpeedVsNATS = 2.0
	// MatchMemoryVsMochi is mochi bytes/sub ÷ fieldgate bytes/sub, judged
	// from MatchMemoryAt subscriptions up.
	MatchMemoryVsMochi = 15.0
	// MatchMemoryVsNATS is NATS bytes/sub ÷ fieldgate bytes/sub, judged
	// from MatchMemoryAt subscriptions up.
	MatchMemoryVsNATS = 6.0
	// MatchMemoryAt is the number of subscriptions from which memory is
	// judged; below it the indexes' fixed costs dominate, so the ratios
	// are shown but not judged.
	MatchMemoryAt = 1_000_000
	// MatchMaxAllocs is fieldgate's allocations per lookup: the design
	// has Match append into the caller's buffer and allocate nothing.
	MatchMaxAllocs = 0
)

// The whole broker over TCP (bench-broker.sh) against mochi-mqtt's Server
// and Mosquitto.
const (
	// ThroughputVsMochi is fieldgate msgs/s ÷ mochi msgs/s, in every
	// throughput scenario.
	ThroughputVsMochi = 1.5
	// ThroughputVsMosquitto is fieldgate msgs/s ÷ Mosquitto msgs/s, in
	// every throughput scenario.
	ThroughputVsMosquitto = 1.0
	// IdleRSSVsMochi is mochi's RSS per idle connection ÷ fieldgate's.
	IdleRSSVsMochi = 4.0
	// MaxIdleRSS is fieldgate's RSS per idle connection, in bytes: a Pi
	// Zero holds thousands of devices in a few tens of MB.
	MaxIdleRSS = 16 << 10
)

// Persisted QoS 1 publishing (bench-storage.sh), judged at the scenario
// with the most publishers, where group commit has the most to share.
const (
	// PersistVsMochi is fieldgate PUBACKs/s ÷ those of mochi with its
	// bolt hook.
	PersistVsMochi = 5.0
	// MaxFsyncsPerMsg is fieldgate's sync calls per PUBACK: one fsync
	// shared by ten messages or more, since an SD card does a few hundred
	// fsyncs a second at best.
	MaxFsyncsPerMsg = 0.1
	// PersistPublishers is the publisher count the storage targets are
	// set for; a run whose largest count is another says so.
	PersistPublishers = 100
)

// The bridge through an outage of its upstream (bench-bridge.sh) against
// Mosquitto's bridge.
const (
	// DrainVsMosquitto is fieldgate's drain ÷ that of Mosquitto's bridge,
	// in messages per second from the first message of the backlog
	// upstream to the last, medians of the unpaced drain runs.
	DrainVsMosquitto = 2.0
	// MinDeliveredPct is the share of acknowledged messages fieldgate's
	// bridge delivers upstream after the outage, and after a SIGKILL right
	// after the last PUBACK, in every run: a PUBACK means the message is
	// in the outbox on disk.
	MinDeliveredPct = 100.0
)

// A gateway at rest (bench-idle.sh): running, ready and connected
// upstream, with no client traffic.
const (
	// MaxIdleCPUPct is fieldgate's CPU time at rest, in percent of one
	// core, for the embedded default configuration and for 50 simulated
	// sensors, each with a bridge connected and no traffic: nothing may
	// tick faster than once a second without work, and what is left is
	// the simulated sensors' own readings.
	MaxIdleCPUPct = 0.2
)

// File is this file's path in the repository, which the report cites.
const File = "scripts/bench/targets/targets.go"
