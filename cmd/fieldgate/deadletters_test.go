package main

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/fieldgate/fieldgate/storage"
)

// deadLettersConfig is a configuration with two bridges on the state
// file path, and an ops address nothing listens on.
func deadLettersConfig(t *testing.T, path string) string {
	t.Helper()
	return writeFile(t, "site.yaml", fmt.Sprintf(`storage:
  path: %q
ops:
  address: "127.0.0.1:1"
sensors: []
outputs: []
bridges:
  - name: cloud
    address: "127.0.0.1:1"
    out:
      - {filter: "data/#", topic: "up/{2}"}
  - name: backup
    address: "127.0.0.1:1"
    out:
      - {filter: "data/#", topic: "backup/{2}"}
`, path))
}

// deadLetterFile writes a state file holding dead letters 1 to 3 of
// bridge cloud and 1 of backup, and one entry in cloud's outbox.
func deadLetterFile(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "state.db")
	db, err := storage.Open(path, storage.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var b storage.Batch
	b.OutboxPut("cloud", &storage.OutboxEntry{Seq: 1, Added: 1_750_000_000e9, Msg: storage.Message{Topic: "up/ok", Payload: []byte("fine"), QoS: 1}})
	for seq := uint64(1); seq <= 3; seq++ {
		b.DeadLetterPut("cloud", &storage.DeadLetter{Seq: seq, Reason: fmt.Sprintf("server closed the link\ton %d", seq), At: 1_760_000_000e9 + int64(seq)*1e9, Failures: 3,
			Entry: storage.OutboxEntry{Seq: 10 + seq, Added: 1_750_000_000e9, Msg: storage.Message{Topic: fmt.Sprintf("up/bad topic %d", seq), Payload: []byte(fmt.Sprint("reading ", seq)), QoS: 1}}})
	}
	b.DeadLetterPut("backup", &storage.DeadLetter{Seq: 1, Reason: "refused", At: 1_760_000_000e9,
		Entry: storage.OutboxEntry{Seq: 4, Msg: storage.Message{Topic: "backup/x", Payload: []byte(strings.Repeat("p", 100))}}})
	if err := db.CommitWait(&b); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	return path
}

// rowsOf returns the listing's lines after its header, as fields.
func rowsOf(out string) [][]string {
	var rows [][]string
	for i, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if i > 0 {
			rows = append(rows, strings.Fields(line))
		}
	}
	return rows
}

// stateOf reads the dead letters' sequences and the outbox's payloads of
// bridge from a stopped gateway's file.
func stateOf(t *testing.T, path, bridge string) (dead []uint64, outbox []string) {
	t.Helper()
	db, err := storage.OpenReadOnly(path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := db.DeadLetterScan(bridge, 0, 0, func(d *storage.DeadLetter) bool { dead = append(dead, d.Seq); return true }); err != nil {
		t.Fatal(err)
	}
	if err := db.OutboxScan(bridge, 0, 0, func(e *storage.OutboxEntry) bool { outbox = append(outbox, string(e.Msg.Payload)); return true }); err != nil {
		t.Fatal(err)
	}
	return dead, outbox
}

// TestDBDeadLetters lists, retries and drops dead letters on a stopped
// gateway's state file, and refuses bad input naming it.
func TestDBDeadLetters(t *testing.T) {
	path := deadLetterFile(t)
	cfg := deadLettersConfig(t, path)

	r := runBinary(t, "db", "deadletters", "-config", cfg)
	rows := rowsOf(r.stdout)
	if r.code != 0 || len(rows) != 4 {
		t.Fatalf("list: code %d, %d rows\n%s%s", r.code, len(rows), r.stdout, r.stderr)
	}
	for _, want := range []string{"bridge", "seq", "topic", "reason", `"up/bad topic 2"`, "server closed the link on 2", `"reading 2"`, "2025-10-09T08:53:22Z", `"pppp`, `…`} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("the list lacks %s:\n%s", want, r.stdout)
		}
	}
	if rows[0][0] != "backup" || rows[1][0] != "cloud" || rows[1][1] != "1" || rows[3][1] != "3" {
		t.Errorf("the list's order: %q", rows)
	}
	r = runBinary(t, "db", "deadletters", "list", "-config", cfg, "-bridge", "cloud", "-limit", "2")
	if rows := rowsOf(r.stdout); r.code != 0 || len(rows) != 2 || rows[0][1] != "2" || rows[1][1] != "3" {
		t.Errorf("the newest 2 of cloud: code %d\n%s%s", r.code, r.stdout, r.stderr)
	}

	r = runBinary(t, "db", "stats", "-path", path)
	var line []string
	for _, l := range strings.Split(r.stdout, "\n") {
		if f := strings.Fields(l); len(f) > 0 && f[0] == "cloud" && strings.Contains(l, "1-3") {
			line = f
		}
	}
	if r.code != 0 || !strings.Contains(r.stdout, "dead letters") || len(line) != 5 || line[1] != "3" || line[4] != "0" {
		t.Errorf("db stats dead letters line %q:\n%s%s", line, r.stdout, r.stderr)
	}

	for _, tc := range []struct {
		name string
		args []string
		code int
		says string
	}{
		{"two bridges, none named", []string{"retry", "-config", cfg, "-all"}, 1, "2 bridges (cloud, backup); name one with -bridge"},
		{"unknown bridge", []string{"drop", "-config", cfg, "-bridge", "nowhere", "-all"}, 1, `no bridge is named "nowhere" in the configuration; its bridges are: cloud, backup`},
		{"unknown seq", []string{"retry", "-config", cfg, "-bridge", "cloud", "2", "9,10"}, 1, "no such dead letter: 9,10"},
		{"neither seq nor -all", []string{"drop", "-config", cfg, "-bridge", "cloud"}, 2, "name the dead letters by number, or give -all"},
		{"both", []string{"drop", "-config", cfg, "-bridge", "cloud", "-all", "2"}, 2, "not both"},
		{"bad seq", []string{"drop", "-config", cfg, "-bridge", "cloud", "two"}, 2, `"two" is not a dead letter's number`},
		{"seq to list", []string{"list", "-config", cfg, "3"}, 2, `unexpected argument "3"`},
	} {
		r := runBinary(t, append([]string{"db", "deadletters"}, tc.args...)...)
		if r.code != tc.code || !strings.Contains(r.stderr, tc.says) {
			t.Errorf("%s: code %d, want %d saying %q:\n%s%s", tc.name, r.code, tc.code, tc.says, r.stdout, r.stderr)
		}
	}
	if dead, outbox := stateOf(t, path, "cloud"); !slices.Equal(dead, []uint64{1, 2, 3}) || len(outbox) != 1 {
		t.Fatalf("refused commands changed the file: dead letters %v, outbox %v", dead, outbox)
	}

	// Flags after the numbers too; the retried one goes to the end of
	// the outbox.
	r = runBinary(t, "db", "deadletters", "retry", "2", "-config", cfg, "-bridge", "cloud")
	if r.code != 0 || !strings.Contains(r.stdout, "retried 1 dead letters of bridge cloud") {
		t.Fatalf("retry 2: code %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if dead, outbox := stateOf(t, path, "cloud"); !slices.Equal(dead, []uint64{1, 3}) || !slices.Equal(outbox, []string{"fine", "reading 2"}) {
		t.Errorf("after retry 2: dead letters %v, outbox %v", dead, outbox)
	}
	r = runBinary(t, "db", "deadletters", "drop", "-config", cfg, "-bridge", "cloud", "-all")
	if r.code != 0 || !strings.Contains(r.stdout, "dropped 2 dead letters of bridge cloud") || !strings.Contains(r.stderr, "dead letters dropped by a command") {
		t.Fatalf("drop -all: code %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if dead, _ := stateOf(t, path, "cloud"); dead != nil {
		t.Errorf("after drop -all: dead letters %v", dead)
	}
	if dead, _ := stateOf(t, path, "backup"); !slices.Equal(dead, []uint64{1}) {
		t.Errorf("another bridge's dead letters: %v", dead)
	}
	if r = runBinary(t, "db", "deadletters", "-config", cfg, "-bridge", "cloud"); r.code != 0 || !strings.Contains(r.stdout, "no dead letters: bridge cloud in "+path) {
		t.Errorf("list of none: code %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r = runBinary(t, "db", "check", "-path", path); r.code != 0 {
		t.Errorf("db check after it all: code %d\n%s%s", r.code, r.stdout, r.stderr)
	}
}

// TestDBDeadLettersLocked: while another process holds the file, the
// command asks the gateway's ops endpoint, and says what failed when
// nothing answers there.
func TestDBDeadLettersLocked(t *testing.T) {
	path := deadLetterFile(t)
	cfg := deadLettersConfig(t, path)
	db, err := storage.Open(path, storage.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for _, args := range [][]string{{"list"}, {"drop", "-bridge", "cloud", "-all"}} {
		r := runBinary(t, append(append([]string{"db", "deadletters"}, args...), "-config", cfg)...)
		if r.code != 1 || !strings.Contains(r.stderr, "a running gateway holds "+path) || !strings.Contains(r.stderr, "http://127.0.0.1:1") {
			t.Errorf("%v on a held file: code %d\n%s%s", args, r.code, r.stdout, r.stderr)
		}
	}
}
