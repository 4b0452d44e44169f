// Package testkit is what the project's tests share: one time scale that
// every deadline in a test is multiplied by, polling for a condition under
// it, and small fixtures (a free loopback address, a buffer the code under
// test writes from its goroutines, a size-limited tmpfs). Its sub-packages
// are the larger fixtures more than one package's tests need: mosquitto (a
// real upstream broker), natscluster (a cluster of NATS servers with
// JetStream and MQTT, another upstream), faultproxy (a TCP link that goes
// silent or is cut), certs (a throwaway CA), pahotest (Paho clients that
// watch and feed a broker), wiretest (hand-framed packets for test doubles),
// notifysocket (systemd's notify socket) and configtest (a part's sections
// of the configuration file read from YAML as the file reads them).
// It is imported only from _test.go files; the firmware never links it.
//
// A deadline is how long a test waits for something that should happen:
// a packet, a process to listen, a condition to hold. On a loaded machine
// it happens later, not never, so every such wait goes through Scale,
// which stretches it under the race detector and by the environment
// variable FIELDGATE_TEST_TIMESCALE. A duration that is itself under test
// (a keepalive, a rate, "nothing arrives within 300 ms") is not a deadline
// and is not scaled.
package testkit
