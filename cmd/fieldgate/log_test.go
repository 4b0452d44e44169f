package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/fieldgate/fieldgate/gateway/config"
)

// streamOf returns f's device and inode as systemd writes them into
// JOURNAL_STREAM.
func streamOf(t *testing.T, f *os.File) (dev, ino uint64) {
	t.Helper()
	fi, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	return uint64(st.Dev), uint64(st.Ino)
}

func tempFile(t *testing.T, name string) *os.File {
	t.Helper()
	f, err := os.Create(filepath.Join(t.TempDir(), name))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

func TestChooseSink(t *testing.T) {
	// Real files stand in for stderr: the journal's stream and another one.
	stderr := tempFile(t, "stderr")
	other := tempFile(t, "other")
	dev, ino := streamOf(t, stderr)
	_, otherIno := streamOf(t, other)
	mine := fmt.Sprintf("%d:%d", dev, ino)

	tests := []struct {
		name   string
		format string
		stderr io.Writer
		stream string
		want   logSink
	}{
		{"journal stream is stderr", "text", stderr, mine, sinkJournal},
		{"journal wins over json", "json", stderr, mine, sinkJournal},
		{"no JOURNAL_STREAM", "text", stderr, "", sinkText},
		{"no JOURNAL_STREAM, json", "json", stderr, "", sinkJSON},
		// Inherited from a service by a child whose stderr went elsewhere.
		{"stream of another file", "text", stderr, fmt.Sprintf("%d:%d", dev, otherIno), sinkText},
		{"same inode, other device", "json", stderr, fmt.Sprintf("%d:%d", dev+1, ino), sinkJSON},
		{"malformed", "text", stderr, "journal", sinkText},
		{"malformed inode", "text", stderr, fmt.Sprintf("%d:x", dev), sinkText},
		{"stderr not a file", "text", &bytes.Buffer{}, mine, sinkText},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := chooseSink(tt.format, tt.stderr, tt.stream); got != tt.want {
				t.Fatalf("chooseSink(%q, _, %q) = %s, want %s", tt.format, tt.stream, got, tt.want)
			}
		})
	}
}

// TestNewLoggerLevelAtRunTime: the LevelVar newLogger returns governs the
// handler it built, whichever sink that is.
func TestNewLoggerLevelAtRunTime(t *testing.T) {
	t.Run("text", func(t *testing.T) {
		t.Setenv("JOURNAL_STREAM", "")
		var buf bytes.Buffer
		log, level := newLogger(config.Log{Level: "info", Format: "text"}, &buf)
		log.Debug("hidden")
		level.Set(slog.LevelDebug)
		log.Debug("shown", "component", "broker")
		out := buf.String()
		if strings.Contains(out, "hidden") || !strings.Contains(out, "level=DEBUG msg=shown component=broker") {
			t.Fatalf("text log after raising the level to debug:\n%s", out)
		}
	})
	t.Run("json", func(t *testing.T) {
		t.Setenv("JOURNAL_STREAM", "")
		var buf bytes.Buffer
		log, level := newLogger(config.Log{Level: "debug", Format: "json"}, &buf)
		level.Set(slog.LevelWarn)
		log.Info("hidden")
		log.Warn("shown")
		out := buf.String()
		if strings.Contains(out, "hidden") || !strings.Contains(out, `"msg":"shown"`) {
			t.Fatalf("json log after lowering the level to warn:\n%s", out)
		}
	})
	t.Run("journal", func(t *testing.T) {
		stderr := tempFile(t, "stderr")
		dev, ino := streamOf(t, stderr)
		t.Setenv("JOURNAL_STREAM", fmt.Sprintf("%d:%d", dev, ino))
		log, level := newLogger(config.Log{Level: "warn", Format: "text"}, stderr)
		// Only Enabled is asked: a record would go to this machine's
		// journal.
		ctx := context.Background()
		if log.Enabled(ctx, slog.LevelInfo) {
			t.Fatal("info enabled at level warn")
		}
		level.Set(slog.LevelInfo)
		if !log.Enabled(ctx, slog.LevelInfo) {
			t.Fatal("info still disabled after setting the level to info")
		}
		if fi, _ := stderr.Stat(); fi.Size() != 0 {
			t.Fatalf("%d bytes written to stderr instead of the journal", fi.Size())
		}
		if _, ok := log.Handler().(*slog.TextHandler); ok {
			t.Fatal("text handler chosen although stderr is the journal stream")
		}
	})
}

func TestJournalField(t *testing.T) {
	tests := []struct{ key, want string }{
		{"component", "COMPONENT"},
		{"err", "ERR"},
		{"dropped_total", "DROPPED_TOTAL"},
		{"client.id", "CLIENT_ID"},
		{"log-level", "LOG_LEVEL"},
		{"µs", "ATTR_S"},
		{"_private", "ATTR_PRIVATE"},
		{"2fa", "ATTR_2FA"},
		{"", "ATTR_"},
		// The handler's own fields cannot be overwritten by an attribute.
		{"message", "ATTR_MESSAGE"},
		{"priority", "ATTR_PRIORITY"},
		{"code_file", "ATTR_CODE_FILE"},
		{strings.Repeat("k", 80), strings.Repeat("K", 64)},
	}
	for _, tt := range tests {
		if got := journalField(tt.key); got != tt.want {
			t.Errorf("journalField(%q) = %q, want %q", tt.key, got, tt.want)
		}
	}
}
