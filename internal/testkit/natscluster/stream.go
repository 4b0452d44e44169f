package natscluster

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fieldgate/fieldgate/internal/testkit"
)

// The stream in which NATS stores every QoS 1 and QoS 2 message an MQTT
// client publishes, under the message's subject with a prefix: NATS
// acknowledges such a PUBLISH (PUBACK, or PUBREC) only once this stream,
// replicated as stream_replicas asks, has stored it. Its retention is by
// interest: a message that no consumer wants when it arrives is not
// kept, so Consume must have its consumer made before the messages come.
const (
	MQTTStream        = "$MQTT_msgs"
	MQTTSubjectPrefix = "$MQTT.msgs."
)

// MQTTSubject returns the subject of MQTTStream under which NATS stores
// the messages of an MQTT topic filter: levels become tokens, + and #
// become * and >. It covers the plain topics tests use (no '.', no empty
// level).
func MQTTSubject(filter string) string {
	return MQTTSubjectPrefix + strings.NewReplacer("/", ".", "+", "*", "#", ">").Replace(filter)
}

// MQTTTopic returns the MQTT topic of a subject of MQTTStream, the inverse
// of MQTTSubject for a topic without wildcards.
func MQTTTopic(subject string) string {
	return strings.ReplaceAll(strings.TrimPrefix(subject, MQTTSubjectPrefix), ".", "/")
}

// Message is one message of a stream as the reader was given it.
type Message struct {
	Seq       uint64 `json:"seq"`       // the stream's sequence number: the order the stream stored it in
	Subject   string `json:"subject"`   // the subject it was stored under
	Data      string `json:"data"`      // the payload
	Delivered uint64 `json:"delivered"` // 1, or more for a message given again
}

// Reader is a natsstream process reading one stream of the cluster.
type Reader struct {
	t      testing.TB
	cmd    *exec.Cmd
	stdin  io.Closer
	done   chan struct{} // closed when the output has been read to its end
	stderr *lineLog

	mu      sync.Mutex
	stopped bool
	err     error
}

// Consume starts a reader of stream with a durable consumer named durable
// on the subjects filter (empty: all), which hands every message it is
// given to fn, from one goroutine, in the order given: the stream's order,
// with a message given again (a lost acknowledgement, a node's restart)
// repeated under its sequence number. Consume returns once the consumer
// exists; the reader is stopped when the test ends.
func (c *Cluster) Consume(t testing.TB, stream, durable, filter string, fn func(Message)) *Reader {
	t.Helper()
	cmd := exec.Command(tool(t, streamTool), "consume",
		"-servers", c.ClientURLs(), "-stream", stream, "-durable", durable, "-filter", filter,
		"-wait", testkit.Scale(startWait).String())
	r := &Reader{t: t, cmd: cmd, done: make(chan struct{}), stderr: &lineLog{max: 200}}
	cmd.Stderr = r.stderr
	configureProc(cmd)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	r.stdin = stdin
	if err := cmd.Start(); err != nil {
		t.Fatalf("natscluster: starting %s: %v", cmd.Path, err)
	}
	ready := make(chan struct{})
	go r.read(stdout, ready, fn)
	t.Cleanup(func() {
		r.Stop()
		if t.Failed() {
			t.Logf("natsstream on %s (%s): its errors:\n%s", stream, filter, r.stderr.String())
		}
	})
	select {
	case <-ready:
	case <-r.done:
		_ = cmd.Wait()
		t.Fatalf("natsstream on %s ended before its consumer was made (%v):\n%s", stream, cmd.ProcessState, r.stderr.String())
	}
	return r
}

// read decodes the reader's lines until its output ends.
func (r *Reader) read(out io.Reader, ready chan struct{}, fn func(Message)) {
	defer close(r.done)
	sc := bufio.NewScanner(out)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	first := true
	for sc.Scan() {
		if first {
			first = false
			if sc.Text() != `{"ready":true}` {
				r.fail(fmt.Errorf("natsstream's first line is %q, not its ready line", sc.Text()))
				return
			}
			close(ready)
			continue
		}
		var m Message
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			r.fail(fmt.Errorf("natsstream wrote %q: %w", sc.Text(), err))
			return
		}
		fn(m)
	}
	if err := sc.Err(); err != nil {
		r.fail(err)
	}
}

func (r *Reader) fail(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err == nil {
		r.err = err
	}
}

// Err returns what ended the reader before Stop, if anything did.
func (r *Reader) Err() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err != nil {
		return r.err
	}
	select {
	case <-r.done:
		if !r.stopped {
			return fmt.Errorf("natsstream ended on its own; its errors:\n%s", r.stderr.String())
		}
	default:
	}
	return nil
}

// Stop ends the reader with SIGTERM and waits until it has handed over
// every line it wrote. It may be called more than once.
func (r *Reader) Stop() {
	r.mu.Lock()
	if r.stopped {
		r.mu.Unlock()
		return
	}
	r.stopped = true
	r.mu.Unlock()
	_ = r.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-r.done:
	case <-time.After(testkit.Scale(stopWait)):
		_ = r.cmd.Process.Kill()
		<-r.done
	}
	_ = r.stdin.Close()
	_ = r.cmd.Wait()
}

// lineLog keeps the last max lines written to it.
type lineLog struct {
	mu    sync.Mutex
	max   int
	lines []string
	part  string
}

func (l *lineLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.part + string(p)
	parts := strings.Split(s, "\n")
	l.part = parts[len(parts)-1]
	l.lines = append(l.lines, parts[:len(parts)-1]...)
	if len(l.lines) > l.max {
		l.lines = l.lines[len(l.lines)-l.max:]
	}
	return len(p), nil
}

func (l *lineLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(append(append([]string(nil), l.lines...), l.part), "\n")
}
