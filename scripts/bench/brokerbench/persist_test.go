package brokerbench

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestCountSyncs(t *testing.T) {
	from := time.Unix(1795981582, 100_000_000)
	to := from.Add(time.Second)
	for _, tc := range []struct {
		name string
		log  string
		want int
	}{
		{
			name: "one thread, no thread ids",
			log: `1795981582.053570 fdatasync(3)    = 0
1795981582.157836 fdatasync(3)    = 0
1795981582.325308 fsync(3)        = 0
1795981583.100000 fdatasync(3)    = 0
`,
			want: 2, // the first starts before from, the last at to
		},
		{
			name: "threads interleaved",
			log: `28710 1795981582.200000 fdatasync(7 <unfinished ...>
28711 1795981582.200100 fsync(8)        = 0
28710 1795981582.300000 <... fdatasync resumed>) = 0
28712 1795981582.400000 sync_file_range(9, 0, 4096, SYNC_FILE_RANGE_WRITE) = 0
28712 1795981582.500000 syncfs(9)       = 0
`,
			want: 4,
		},
		{
			name: "other lines",
			log: `28710 1795981582.200000 +++ exited with 0 +++
28710 1795981582.200000 --- SIGCHLD {si_signo=SIGCHLD} ---
28710 1795981582.200000 fsyncx(3)       = 0
28710 1795981582.200000 write(3, "fsync(", 6) = 6

`,
			want: 0,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := countSyncs(strings.NewReader(tc.log), from, to)
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Errorf("countSyncs = %d, want %d", got, tc.want)
			}
		})
	}
}

func TestParseStraceTime(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    time.Time
		wantErr bool
	}{
		{in: "1795981582.053570", want: time.Unix(1795981582, 53_570_000)},
		{in: "1795981582.5", want: time.Unix(1795981582, 500_000_000)},
		{in: "1795981582", want: time.Unix(1795981582, 0)},
		{in: "x.1", wantErr: true},
		{in: "1.x", wantErr: true},
	} {
		got, err := parseStraceTime(tc.in)
		if (err != nil) != tc.wantErr || !got.Equal(tc.want) {
			t.Errorf("parseStraceTime(%q) = %v, %v; want %v, error %t", tc.in, got, err, tc.want, tc.wantErr)
		}
	}
}

// TestPersistScenario runs a scaled-down persistence scenario against
// mochi in this process (which keeps offline sessions in memory) and checks
// that it reports its figures and reads the whole queue back.
func TestPersistScenario(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a broker for a few seconds")
	}
	cfg := DefaultConfig()
	cfg.Broker, cfg.Addr, cfg.PID = "mochi", startMochi(t), os.Getpid()
	// mochi keeps at most 8,192 messages for an offline session: a short
	// run with one message in flight stays well below that.
	cfg.Warmup, cfg.Duration = 10*time.Millisecond, 100*time.Millisecond
	syncLog := filepath.Join(t.TempDir(), "sync.log")
	if err := os.WriteFile(syncLog, nil, 0o644); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name    string
		pc      PersistConfig
		scen    string
		units   []string
		noUnits []string
	}{
		{
			name:    "read back",
			pc:      PersistConfig{Publishers: []int{1}, Subscribers: 2, Window: 1, Drain: 10 * time.Second},
			scen:    "persist-qos1-1x2",
			units:   []string{"acks/s", "disk-B/msg", "disk-KiB/s", "stored-%", "replay-msgs/s"},
			noUnits: []string{"fsyncs/s"},
		},
		{
			name:    "traced",
			pc:      PersistConfig{Publishers: []int{1}, Subscribers: 1, Window: 4, SyncLog: syncLog},
			scen:    "persist-qos1-1x1-traced",
			units:   []string{"acks/s", "fsyncs/s", "fsyncs/msg"},
			noUnits: []string{"stored-%"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ss := PersistScenarios(tc.pc)
			if len(ss) != 1 || ss[0].Name != tc.scen || ss[0].Group != PersistGroup {
				t.Fatalf("PersistScenarios = %+v, want one named %s", ss, tc.scen)
			}
			res, err := ss[0].Run(context.Background(), &cfg)
			if err != nil {
				t.Fatal(err)
			}
			units := checkUnits(t, res, tc.units, tc.noUnits)
			if v := units["acks/s"]; v <= 0 {
				t.Errorf("acks/s = %v", v)
			}
			if v, ok := units["stored-%"]; ok && v != 100 {
				t.Errorf("stored-%% = %v", v)
			}
			if v, ok := units["fsyncs/s"]; ok && v != 0 {
				t.Errorf("fsyncs/s = %v from an empty log", v)
			}
		})
	}
}

func TestDrainLostSession(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Addr = startMochi(t)
	_, _, _, err := drain(context.Background(), &cfg, "never-connected", time.Second)
	if err == nil || !strings.Contains(err.Error(), "no session present") {
		t.Errorf("drain = %v, want ErrSessionLost", err)
	}
}
