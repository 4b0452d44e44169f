package main

import (
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"syscall"

	"github.com/fieldgate/fieldgate/gateway/config"
	slogjournal "github.com/systemd/slog-journal"
)

// logSink is where the process logger writes.
type logSink int

const (
	sinkText    logSink = iota // key=value lines on stderr
	sinkJSON                   // one JSON object a line on stderr
	sinkJournal                // native journal entries, one field per attribute
)

func (s logSink) String() string {
	return [...]string{"text", "json", "journal"}[s]
}

// chooseSink picks the journal when systemd connected stderr to it, and
// otherwise the configured format. Under journald the journal wins over
// log.format: its entries keep every attribute as a field one can filter
// on (journalctl COMPONENT=broker), and journalctl -o json turns them into
// JSON on demand.
func chooseSink(format string, stderr io.Writer, journalStream string) logSink {
	if onJournal(stderr, journalStream) {
		return sinkJournal
	}
	if format == "json" {
		return sinkJSON
	}
	return sinkText
}

// onJournal reports whether stderr is the stream systemd connected to the
// journal. JOURNAL_STREAM alone is not proof: a child of a service inherits
// it with stderr redirected elsewhere, so, as systemd.exec(5) advises, its
// device and inode must be stderr's own.
func onJournal(stderr io.Writer, journalStream string) bool {
	f, ok := stderr.(*os.File)
	if !ok || journalStream == "" {
		return false
	}
	devs, inos, ok := strings.Cut(journalStream, ":")
	if !ok {
		return false
	}
	dev, err1 := strconv.ParseUint(devs, 10, 64)
	ino, err2 := strconv.ParseUint(inos, 10, 64)
	if err1 != nil || err2 != nil {
		return false
	}
	fi, err := f.Stat()
	if err != nil {
		return false
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	return ok && uint64(st.Dev) == dev && uint64(st.Ino) == ino
}

// newLogger builds the process logger on stderr or the journal, as
// chooseSink decides. The returned LevelVar changes its level at run time.
func newLogger(cfg config.Log, stderr io.Writer) (*slog.Logger, *slog.LevelVar) {
	level := new(slog.LevelVar)
	level.Set(cfg.SlogLevel())
	opts := &slog.HandlerOptions{Level: level}
	sink := chooseSink(cfg.Format, stderr, os.Getenv("JOURNAL_STREAM"))
	if sink == sinkJournal {
		h, err := slogjournal.NewHandler(&slogjournal.Options{
			Level:        level,
			ReplaceAttr:  func(_ []string, a slog.Attr) slog.Attr { a.Key = journalField(a.Key); return a },
			ReplaceGroup: journalField,
		})
		if err == nil {
			return slog.New(h), level
		}
		// Lines on stderr still reach the journal, as plain text.
		log := slog.New(slog.NewTextHandler(stderr, opts))
		log.Warn("logging as text: cannot open the journal socket", "err", err)
		return log, level
	}
	if sink == sinkJSON {
		return slog.New(slog.NewJSONHandler(stderr, opts)), level
	}
	return slog.New(slog.NewTextHandler(stderr, opts)), level
}

// journalReserved are the fields the journal or the handler give a meaning
// (systemd.journal-fields(7)); an attribute of the same name is renamed so
// that it cannot replace the message, the priority or the origin.
var journalReserved = map[string]bool{
	"MESSAGE": true, "MESSAGE_ID": true, "PRIORITY": true, "ERRNO": true,
	"CODE_FILE": true, "CODE_LINE": true, "CODE_FUNC": true,
	"SYSLOG_FACILITY": true, "SYSLOG_IDENTIFIER": true, "SYSLOG_PID": true,
	"SYSLOG_TIMESTAMP": true, "SYSLOG_RAW": true, "DOCUMENTATION": true,
	"INVOCATION_ID": true, "USER_INVOCATION_ID": true, "TID": true,
	"UNIT": true, "USER_UNIT": true, "OBJECT_PID": true,
}

// journalFieldMax is journald's limit on a field name; longer ones are
// dropped whole.
const journalFieldMax = 64

// journalField turns an attribute key into a journal field name: the
// journal keeps only names of the form [A-Z_][A-Z0-9_]* that do not start
// with an underscore (those are its own trusted fields), and silently
// drops the rest, so "err" becomes ERR and "client.id" CLIENT_ID.
func journalField(key string) string {
	b := []byte(strings.ToUpper(key))
	for i, c := range b {
		if (c < 'A' || c > 'Z') && (c < '0' || c > '9') {
			b[i] = '_'
		}
	}
	name := string(b)
	if name == "" || name[0] == '_' || (name[0] >= '0' && name[0] <= '9') || journalReserved[name] {
		name = "ATTR_" + strings.TrimLeft(name, "_")
	}
	if len(name) > journalFieldMax {
		name = name[:journalFieldMax]
	}
	return name
}
