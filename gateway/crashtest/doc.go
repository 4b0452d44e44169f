// Package crashtest holds the gateway's crash test, and nothing else: it
// runs the real fieldgate binary under QoS 1 and QoS 2 load, kills it with
// SIGKILL at random moments, restarts it on the same state file, and checks
// the promise the broker makes when it acknowledges a PUBLISH: every
// acknowledged message reaches every persistent session subscribed to it,
// none is lost, and at QoS 2 none arrives twice.
//
// FIELDGATE_CRASH_KILLS sets the number of kill cycles (10 by default;
// `make soak` runs 100) and FIELDGATE_CRASH_SEED replays the kill timings
// of an earlier run, whose seed the test logs.
package crashtest
