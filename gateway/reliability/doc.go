// Package reliability holds the gateway's reliability suite, and nothing
// else: tests that run the real fieldgate binary as a user would and break
// things around it. They check the promises a careful user relies on
// before trusting a site to the gateway:
//
//   - crash consistency: SIGKILLs under QoS 1 and QoS 2 load with
//     persistent subscribers and an active bridge lose no acknowledged
//     message, and deliver none twice at QoS 2;
//   - bridge outages (clean close, silent drop, upstream restarts with
//     and without its session, a long outage): everything acknowledged
//     arrives upstream, in order per route;
//   - the bridge against a NATS cluster, a cloud broker unlike
//     Mosquitto: MQTT 3.1.1 only, QoS 2 publishes and some topics
//     refused, nodes that fail; no reconnect storm, no uplink blocked by
//     one message, and a fleet of gateways that loses nothing through
//     a node's, a gateway's and a link's faults, counted from NATS's own
//     message stream;
//   - slow consumers: one slow subscriber costs memory within the
//     configured budgets and no latency to the others;
//   - connection storms: no leak of memory or goroutines;
//   - malformed input over TCP: no panic, and the broker keeps serving;
//   - hostile clients: a user with a login of their own cannot read
//     another's messages (by taking a session over, by a wildcard, or
//     through a rule revoked since), and every resource a client can
//     grow is bounded;
//   - bad configuration: `fieldgate check` names the key and the line.
//
// make test runs every case at a short length; make soak runs them at
// full length (FIELDGATE_SOAK=1) and writes docs/RELIABILITY.md from the
// records each case leaves (internal/relrecord). FIELDGATE_CRASH_KILLS
// overrides the number of kill cycles and FIELDGATE_CRASH_SEED replays the
// kill timings of an earlier run, whose seed the test logs.
package reliability
