package main

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/fieldgate/fieldgate/storage"
)

// TestDBCheckAndStats runs fieldgate db check and stats on a real state
// file: a sound one, a damaged one, and one named through a configuration.
func TestDBCheckAndStats(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "state.db")
	db, err := storage.Open(path, storage.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var b storage.Batch
	b.PutSession(&storage.Session{ClientID: "dev-1", Expiry: 3600e9})
	b.PutSub("dev-1", storage.Sub{Filter: "plant/#", Opts: 1})
	b.SetRetained(&storage.Message{Topic: "plant/door", Payload: []byte("open"), QoS: 1, Retain: true})
	for seq := uint64(4); seq <= 6; seq++ {
		b.OutboxPut("cloud", &storage.OutboxEntry{Seq: seq, Added: 1_750_000_000e9 + int64(seq)*1e9, Msg: storage.Message{Topic: "up/door", Payload: []byte("open")}})
	}
	if err := db.CommitWait(&b); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}

	r := runBinary(t, "db", "check", "-path", path)
	if r.code != 0 || !strings.Contains(r.stdout, "ok: "+path) {
		t.Fatalf("db check on a sound file: code %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	r = runBinary(t, "db", "stats", "-path", path)
	for _, want := range []string{fmt.Sprintf("schema %d", storage.SchemaVersion), "1 sessions", "retained", "subs", "sessions", "outbox", "upflight"} {
		if r.code != 0 || !strings.Contains(r.stdout, want) {
			t.Fatalf("db stats lacks %q (code %d):\n%s%s", want, r.code, r.stdout, r.stderr)
		}
	}
	// The outbox of bridge cloud: 3 entries of 7 + 4 + 64 bytes, sequences
	// 4 to 6, the oldest queued at 1750000004.
	var cloud []string
	for _, line := range strings.Split(r.stdout, "\n") {
		if f := strings.Fields(line); len(f) > 0 && f[0] == "cloud" {
			cloud = f
		}
	}
	if want := []string{"cloud", "3", "225", "4-6", "2025-06-15T15:06:44Z", "0"}; !slices.Equal(cloud, want) {
		t.Errorf("db stats outbox line %q, want %q:\n%s", cloud, want, r.stdout)
	}

	cfg := writeFile(t, "site.yaml", "storage:\n  path: "+path+"\n")
	if r = runBinary(t, "db", "check", "-config", cfg); r.code != 0 {
		t.Fatalf("db check through -config: code %d\n%s%s", r.code, r.stdout, r.stderr)
	}

	// Damage: cut the file in half.
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(dir, "cut.db")
	if err := os.WriteFile(bad, data[:len(data)/2], 0o600); err != nil {
		t.Fatal(err)
	}
	r = runBinary(t, "db", "check", "-path", bad)
	if r.code != 1 || r.stderr == "" {
		t.Fatalf("db check on a cut file: code %d, want 1 with a message\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r = runBinary(t, "db", "check", "-path", filepath.Join(dir, "missing.db")); r.code != 1 || !strings.Contains(r.stderr, "missing.db") {
		t.Fatalf("db check on a missing file: code %d\n%s", r.code, r.stderr)
	}
	if r = runBinary(t, "db", "frobnicate"); r.code != 2 {
		t.Fatalf("db with an unknown subcommand: code %d, want 2", r.code)
	}
}
