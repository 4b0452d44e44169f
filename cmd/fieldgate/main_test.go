package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fieldgate/fieldgate/internal/testkit"
)

// These tests build the real binary and run it as a user or an init system
// would, so flags, exit codes, output and signal handling are covered as
// shipped.

const (
	testVersion = "1.2.3-test"
	testCommit  = "abc1234"
)

// binary is the command built once for all tests, stamped with a version
// the way the Makefile stamps releases.
var binary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "fieldgate-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binary = filepath.Join(dir, "fieldgate")
	build := exec.Command("go", "build",
		"-ldflags", "-X main.version="+testVersion+" -X main.commit="+testCommit,
		"-o", binary, ".")
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "go build of the binary under test: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// result is what one run of the binary produced.
type result struct {
	stdout, stderr string
	code           int
}

func runBinary(t *testing.T, args ...string) result {
	t.Helper()
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(binary, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		t.Fatalf("run %v: %v", args, err)
	}
	return result{stdout.String(), stderr.String(), cmd.ProcessState.ExitCode()}
}

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

const goodConfig = `log:
  level: debug
listeners:
  - name: lan
    type: tcp
    address: 127.0.0.1:0
sensors:
  - name: t1
    kind: bme280
    bus: sim
    address: "0x76"
    interval: 1s
`

func TestCommands(t *testing.T) {
	good := writeFile(t, "good.yaml", goodConfig)
	bad := writeFile(t, "bad.yaml", `log:
  level: loud
listeners:
  - name: lan
    type: tcp
    adress: 127.0.0.1:1883
sensors:
  - name: t1
    kind: bme280
    bus: sim
    address: "0x50"
    interval: 0s
    options: {oversampling: 3x}
`)

	tests := []struct {
		name       string
		args       []string
		wantCode   int
		wantStdout []string
		wantStderr []string
	}{
		{"version", []string{"version"}, 0,
			[]string{"fieldgate " + testVersion, "commit " + testCommit, runtime.Version(), runtime.GOOS + "/" + runtime.GOARCH}, nil},
		{"check embedded default", []string{"check"}, 0,
			[]string{"ok: embedded:default.yaml"}, nil},
		{"check good file", []string{"check", "-config", good}, 0,
			[]string{"ok: " + good}, nil},
		{"check bad file", []string{"check", "-config", bad}, 1, nil, []string{
			bad + `:2: log.level: "loud" is not allowed; use one of debug, info, warn, error`,
			bad + ":4: listeners[0].address: required",
			bad + ":6: listeners[0].adress: unknown key (did you mean \"address\"?)",
			bad + `:11: sensors[0].address: a bme280 answers only at 0x76 or 0x77, not 0x50`,
			bad + ":12: sensors[0].interval: must be positive",
			bad + `:13: sensors[0].options.oversampling: "3x" is not allowed`,
		}},
		{"check missing file", []string{"check", "-config", filepath.Join(t.TempDir(), "none.yaml")}, 1,
			nil, []string{"no such file"}},
		{"check stray argument", []string{"check", good}, 2, nil, []string{"pass the file with -config"}},
		{"help", []string{"help"}, 0, []string{"usage: fieldgate", "check [-config FILE]"}, nil},
		{"no command", nil, 2, nil, []string{"usage: fieldgate"}},
		{"unknown command", []string{"serve"}, 2, nil, []string{`unknown command "serve"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := runBinary(t, tt.args...)
			if r.code != tt.wantCode {
				t.Errorf("exit code %d, want %d\nstdout:\n%s\nstderr:\n%s", r.code, tt.wantCode, r.stdout, r.stderr)
			}
			for _, w := range tt.wantStdout {
				if !strings.Contains(r.stdout, w) {
					t.Errorf("stdout lacks %q:\n%s", w, r.stdout)
				}
			}
			for _, w := range tt.wantStderr {
				if !strings.Contains(r.stderr, w) {
					t.Errorf("stderr lacks %q:\n%s", w, r.stderr)
				}
			}
		})
	}

	// One problem per line, and nothing else, so scripts can count them.
	r := runBinary(t, "check", "-config", bad)
	if lines := strings.Split(strings.TrimSpace(r.stderr), "\n"); len(lines) != 6 {
		t.Errorf("check printed %d lines, want 6 problems:\n%s", len(lines), r.stderr)
	}
}

func TestRunStopsOnSIGTERM(t *testing.T) {
	for _, tt := range []struct {
		name    string
		config  string // empty: the embedded default
		stopped string // how the stop line looks in this log format
	}{
		{"embedded text log", "", `msg="fieldgate stopped"`},
		{"file json log", "log:\n  format: json\nstorage:\n  path: state.db\nlisteners:\n  - {name: t, type: tcp, address: 127.0.0.1:0}\nops: {address: \"\"}\n", `"msg":"fieldgate stopped"`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			args := []string{"run"}
			if tt.config != "" {
				args = append(args, "-config", writeFile(t, "run.yaml", tt.config))
			}
			var stderr testkit.Buffer
			cmd := exec.Command(binary, args...)
			cmd.Stderr = &stderr
			cmd.Dir = t.TempDir() // where relative state paths land
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = cmd.Process.Kill() })

			// Signal only once the gateway is up, so the test exercises
			// the shutdown path rather than a half-started process.
			testkit.WaitFor(t, 10*time.Second, "the start line", func() bool {
				return strings.Contains(stderr.String(), "gateway started")
			})
			if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}

			done := make(chan error, 1)
			go func() { done <- cmd.Wait() }()
			select {
			case err := <-done:
				if err != nil {
					t.Fatalf("exit after SIGTERM: %v, want code 0\n%s", err, stderr.String())
				}
			case <-time.After(testkit.Scale(5 * time.Second)):
				t.Fatalf("still running %v after SIGTERM:\n%s", testkit.Scale(5*time.Second), stderr.String())
			}
			if !strings.Contains(stderr.String(), tt.stopped) {
				t.Errorf("log lacks %s:\n%s", tt.stopped, stderr.String())
			}
		})
	}
}
