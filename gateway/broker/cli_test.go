package broker

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fieldgate/fieldgate/internal/testkit"
)

// Interoperability with another implementation's clients: Debian's
// mosquitto_pub and mosquitto_sub, at MQTT 3.1.1 and 5.0.

// cliTimeout bounds one run of a client binary, on the suite's time
// scale; the -W given to mosquitto_sub is a little less, so that it gives
// up on its own first. A run with a password waits its turn for a bcrypt
// check (see wireWait), hence ten seconds rather than a few.
var cliTimeout = testkit.Scale(10 * time.Second)

// cliVersions are the protocol versions the clients are run at.
var cliVersions = []string{"mqttv311", "mqttv5"}

// cliFormat makes mosquitto_sub print topic, QoS, retain flag and payload
// of each message on a line.
const cliFormat = "%t|%q|%r|%p"

// cliNeed fails the test when the client binaries are missing, unless
// FIELDGATE_SKIP_CLI=1 asks to skip it.
func cliNeed(t *testing.T) {
	t.Helper()
	for _, name := range []string{"mosquitto_pub", "mosquitto_sub"} {
		if _, err := exec.LookPath(name); err != nil {
			if os.Getenv("FIELDGATE_SKIP_CLI") == "1" {
				t.Skipf("%s not found and FIELDGATE_SKIP_CLI=1", name)
			}
			t.Fatalf("%s not found (%v): run apt-get install -y mosquitto-clients, or set FIELDGATE_SKIP_CLI=1 to skip", name, err)
		}
	}
}

// cliTCP returns the arguments that point a client at tb's TCP listener.
func cliTCP(tb *testBroker) []string {
	host, port, _ := strings.Cut(tb.Addr, ":")
	return []string{"-h", host, "-p", port}
}

// cliSub is a running mosquitto_sub.
type cliSub struct {
	id       string
	cmd      *exec.Cmd
	out, err bytes.Buffer
	done     chan error
}

// cliStartSub starts mosquitto_sub with client id id, printing cliFormat,
// and waits until the broker holds its subscription to filter, the first
// -t in args. It is killed with the test if still running.
func cliStartSub(t *testing.T, b *Broker, target []string, id string, args ...string) *cliSub {
	t.Helper()
	all := append(append([]string{}, target...), "-i", id, "-F", cliFormat, "-W", strconv.Itoa(int(cliTimeout/time.Second)-1))
	all = append(all, args...)
	s := &cliSub{id: id, cmd: exec.Command("mosquitto_sub", all...), done: make(chan error, 1)}
	s.cmd.Stdout, s.cmd.Stderr = &s.out, &s.err
	if err := s.cmd.Start(); err != nil {
		t.Fatalf("mosquitto_sub: %v", err)
	}
	go func() { s.done <- s.cmd.Wait() }()
	t.Cleanup(func() {
		_ = s.cmd.Process.Kill()
		<-s.done
	})
	filter := ""
	for i := 0; i+1 < len(args); i++ {
		if args[i] == "-t" {
			filter = args[i+1]
			break
		}
	}
	waitSubscribed(t, b, id, filter, s)
	return s
}

// waitSubscribed waits until session id has a subscription to filter.
func waitSubscribed(t *testing.T, b *Broker, id, filter string, s *cliSub) {
	t.Helper()
	deadline := time.Now().Add(cliTimeout)
	for {
		b.mu.Lock()
		sess := b.sessions[id]
		ok := false
		if sess != nil {
			sess.mu.Lock()
			_, ok = sess.subs[filter]
			sess.mu.Unlock()
		}
		b.mu.Unlock()
		if ok {
			return
		}
		select {
		case err := <-s.done:
			s.done <- err
			if err == nil {
				// Done already: a retained message was all it waited for.
				return
			}
			t.Fatalf("mosquitto_sub %q ended before subscribing to %q: %v\n%s%s", id, filter, err, &s.out, &s.err)
		case <-time.After(5 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("mosquitto_sub %q did not subscribe to %q within %v", id, filter, cliTimeout)
		}
	}
}

// wait waits for mosquitto_sub to exit and returns what it printed; it
// fails the test when it exits with an error.
func (s *cliSub) wait(t *testing.T) string {
	t.Helper()
	select {
	case err := <-s.done:
		s.done <- err
		if err != nil {
			t.Fatalf("mosquitto_sub: %v\nstdout: %s\nstderr: %s", err, &s.out, &s.err)
		}
	case <-time.After(cliTimeout):
		t.Fatalf("mosquitto_sub still running after %v; printed %q", cliTimeout, s.out.String())
	}
	return strings.TrimSpace(s.out.String())
}

// expect waits for mosquitto_sub to exit and requires it to have printed
// exactly want, one cliFormat line per message.
func (s *cliSub) expect(t *testing.T, want string) {
	t.Helper()
	if got := s.wait(t); got != want {
		t.Fatalf("mosquitto_sub %s printed %q, want %q", s.id, got, want)
	}
}

// cliRun runs a client binary to the end and returns its exit error and
// its output, stdout then stderr.
func cliRun(t *testing.T, name string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), cliTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.WaitDelay = time.Second
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("%s %s: still running after %v", name, strings.Join(args, " "), cliTimeout)
	}
	return string(out), err
}

// cliPub runs mosquitto_pub and fails the test if it fails.
func cliPub(t *testing.T, target []string, args ...string) {
	t.Helper()
	out, err := cliRun(t, "mosquitto_pub", append(append([]string{}, target...), args...)...)
	if err != nil {
		t.Fatalf("mosquitto_pub %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// TestCLIPubSub publishes with mosquitto_pub and receives with
// mosquitto_sub at every QoS, each client at each protocol version: the
// message arrives once, at its QoS, with the retain flag clear
// [MQTT-3.3.1-9].
func TestCLIPubSub(t *testing.T) {
	cliNeed(t)
	tb := startBroker(t, nil)
	target := cliTCP(tb)
	for _, subV := range cliVersions {
		for _, pubV := range cliVersions {
			for qos := 0; qos <= 2; qos++ {
				name := fmt.Sprintf("sub %s pub %s QoS %d", subV, pubV, qos)
				t.Run(name, func(t *testing.T) {
					topic := fmt.Sprintf("cli/%s/%s/%d", subV, pubV, qos)
					sub := cliStartSub(t, tb.Broker, target, "sub-"+strings.ReplaceAll(topic, "/", "-"),
						"-V", subV, "-q", strconv.Itoa(qos), "-C", "1", "-t", topic)
					payload := "hello " + name
					cliPub(t, target, "-V", pubV, "-q", strconv.Itoa(qos), "-t", topic, "-m", payload)
					sub.expect(t, fmt.Sprintf("%s|%d|0|%s", topic, qos, payload))
				})
			}
		}
	}
}

// TestCLIRetained publishes retained messages with mosquitto_pub -r: a
// later subscriber gets them with the retain flag set [MQTT-3.3.1-8], a
// live one with it clear [MQTT-3.3.1-9], and a zero-length retained
// message clears the topic [MQTT-3.3.1-10].
func TestCLIRetained(t *testing.T) {
	cliNeed(t)
	tb := startBroker(t, nil)
	target := cliTCP(tb)
	for _, v := range cliVersions {
		t.Run(v, func(t *testing.T) {
			topic := "cli/retained/" + v
			live := cliStartSub(t, tb.Broker, target, "live-"+v, "-V", v, "-q", "1", "-C", "1", "-t", topic)
			cliPub(t, target, "-V", v, "-q", "1", "-r", "-t", topic, "-m", "kept")
			live.expect(t, topic+"|1|0|kept")

			late := cliStartSub(t, tb.Broker, target, "late-"+v, "-V", v, "-q", "2", "-C", "1", "-t", topic)
			late.expect(t, topic+"|1|1|kept")

			cliPub(t, target, "-V", v, "-r", "-n", "-t", topic)
			// The topic holds nothing now: a new subscriber's first
			// message is the live one that follows its subscription.
			after := cliStartSub(t, tb.Broker, target, "after-"+v, "-V", v, "-C", "1", "-t", topic)
			cliPub(t, target, "-V", v, "-t", topic, "-m", "live")
			after.expect(t, topic+"|0|0|live")
		})
	}
}

// TestCLIWill kills a mosquitto_sub that set --will-topic: the broker
// publishes its will [MQTT-3.1.2-8].
func TestCLIWill(t *testing.T) {
	cliNeed(t)
	tb := startBroker(t, nil)
	target := cliTCP(tb)
	for _, v := range cliVersions {
		t.Run(v, func(t *testing.T) {
			topic := "cli/will/" + v
			doomed := cliStartSub(t, tb.Broker, target, "doomed-"+v, "-V", v, "-t", "cli/idle",
				"--will-topic", topic, "--will-payload", "gone", "--will-qos", "1")
			watch := cliStartSub(t, tb.Broker, target, "watch-"+v, "-V", v, "-q", "2", "-C", "1", "-t", topic)
			if err := doomed.cmd.Process.Kill(); err != nil {
				t.Fatal(err)
			}
			watch.expect(t, topic+"|1|0|gone")
		})
	}
}

// TestCLIAuth connects with user names and passwords against a password
// file: the right ones get through, the wrong ones and anonymous clients
// are refused with the code that says why (3.1.1 §3.2.2.3; 5.0 §3.2.2.2).
func TestCLIAuth(t *testing.T) {
	cliNeed(t)
	passwd := writePasswordFile(t, "meter", "kWh-2024")
	tb := startBroker(t, func(o *Options) {
		o.AllowAnonymous = false
		o.PasswordFile = passwd
	})
	target := cliTCP(tb)
	for _, v := range cliVersions {
		t.Run(v, func(t *testing.T) {
			topic := "cli/auth/" + v
			sub := cliStartSub(t, tb.Broker, target, "auth-sub-"+v, "-V", v, "-u", "meter", "-P", "kWh-2024", "-C", "1", "-t", topic)
			cliPub(t, target, "-V", v, "-u", "meter", "-P", "kWh-2024", "-t", topic, "-m", "reading")
			sub.expect(t, topic+"|0|0|reading")
			for _, tc := range []struct {
				name string
				args []string
				want string // in mosquitto_pub's error message, lower case
			}{
				{"wrong password", []string{"-u", "meter", "-P", "guess"}, "bad user name or password"},
				{"unknown user", []string{"-u", "nobody", "-P", "kWh-2024"}, "bad user name or password"},
				{"anonymous", nil, "not authori"},
			} {
				args := append(append(append([]string{}, target...), "-V", v, "-t", topic, "-m", "x"), tc.args...)
				out, err := cliRun(t, "mosquitto_pub", args...)
				var exit *exec.ExitError
				if !errors.As(err, &exit) {
					t.Fatalf("%s: mosquitto_pub succeeded or did not run (%v): %s", tc.name, err, out)
				}
				if !strings.Contains(strings.ToLower(out), tc.want) {
					t.Fatalf("%s: mosquitto_pub said %q, want it to mention %q", tc.name, out, tc.want)
				}
			}
		})
	}
}

// TestCLIUnixSocket runs both clients over the unix socket listener.
func TestCLIUnixSocket(t *testing.T) {
	cliNeed(t)
	for _, name := range []string{"mosquitto_sub", "mosquitto_pub"} {
		help, _ := exec.Command(name, "--help").CombinedOutput()
		if !bytes.Contains(help, []byte("--unix")) {
			t.Skipf("this %s has no --unix option", name)
		}
	}
	sock := filepath.Join(t.TempDir(), "mqtt.sock")
	tb := startBroker(t, func(o *Options) {
		o.Listeners = append(o.Listeners, Listener{Name: "unix", Type: ListenerUnix, Address: sock})
	})
	target := []string{"--unix", sock}
	for _, v := range cliVersions {
		t.Run(v, func(t *testing.T) {
			topic := "cli/unix/" + v
			sub := cliStartSub(t, tb.Broker, target, "unix-sub-"+v, "-V", v, "-q", "2", "-C", "1", "-t", topic)
			cliPub(t, target, "-V", v, "-q", "2", "-t", topic, "-m", "over the socket")
			sub.expect(t, topic+"|2|0|over the socket")
		})
	}
}
