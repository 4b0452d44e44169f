package auth

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/crypto/bcrypt"
)

func TestMain(m *testing.M) {
	// The cheapest cost bcrypt allows keeps the tests fast, above all
	// under -race; TestHashPasswordCost checks the real one.
	hashCost = bcrypt.MinCost
	os.Exit(m.Run())
}

// hash returns a bcrypt hash of password at the test cost.
func hash(t testing.TB, password string) string {
	t.Helper()
	h, err := HashPassword([]byte(password))
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// hashAt returns a bcrypt hash of password at cost.
func hashAt(t testing.TB, password string, cost int) string {
	t.Helper()
	h, err := bcrypt.GenerateFromPassword([]byte(password), cost)
	if err != nil {
		t.Fatal(err)
	}
	return string(h)
}

func writeFile(t testing.TB, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "passwd")
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func readFile(t testing.TB, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func load(t testing.TB, content string) *Passwords {
	t.Helper()
	p, err := LoadPasswords(writeFile(t, content))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestLoadPasswordsGood(t *testing.T) {
	bobHash := hash(t, "bob's secret")
	// Every prefix bcrypt implementations write; Go's writes $2a$.
	yHash := "$2y$" + hash(t, "y pass")[4:]
	bHash := "$2b$" + hash(t, "b pass")[4:]
	content := "# fieldgate password file\n" +
		"\n" +
		"   \t\n" +
		"bob:" + bobHash + "\n" +
		"#carol:" + bobHash + "\n" +
		"pi user:" + yHash + "\r\n" + // written on Windows
		"ünïcode:" + bHash + "  \n" + // trailing blanks
		"last:" + bobHash // no final newline
	p := load(t, content)

	if p.Len() != 4 {
		t.Errorf("Len = %d, want 4", p.Len())
	}
	for _, c := range []struct {
		user, password string
		want           bool
	}{
		{"bob", "bob's secret", true},
		{"pi user", "y pass", true},
		{"ünïcode", "b pass", true},
		{"last", "bob's secret", true},
		{"bob", "bob's secreT", false},
		{"carol", "bob's secret", false}, // commented out
		{"#carol", "bob's secret", false},
		{"Bob", "bob's secret", false},
	} {
		if got := p.Check(c.user, []byte(c.password)); got != c.want {
			t.Errorf("Check(%q, %q) = %v, want %v", c.user, c.password, got, c.want)
		}
	}
}

func TestLoadPasswordsBadLines(t *testing.T) {
	good := hash(t, "pw")
	tests := []struct {
		name    string
		content string
		want    string // the whole problem line, after the file name
		secret  string // must not appear in the error
	}{
		{"no colon", "bob:" + good + "\nhunter2\n", ":2: no ':' between username and hash; write entries with fieldgate passwd", "hunter2"},
		{"indented comment", "  # note\n", ":1: no ':' between username and hash", ""},
		{"empty username", "\n\n:" + good + "\n", ":3: the username is empty", ""},
		{"control character", "bo\x01b:" + good, `:1: user "bo\x01b": the username contains the control character U+0001`, ""},
		{"DEL", "bob\x7f:" + good, `:1: user "bob\x7f": the username contains the control character U+007F`, ""},
		{"invalid UTF-8", "# x\nb\xffob:" + good, `:2: user "b\xffob": the username is not valid UTF-8`, ""},
		{"long username", strings.Repeat("u", MaxUsernameLen+1) + ":" + good, ":1: user \"" + strings.Repeat("u", 64) + "…\": the username is longer than 65535 bytes", ""},
		{"plain password", "bob:hunter2", `:1: user "bob": hash is not a bcrypt hash; write entries with fieldgate passwd`, "hunter2"},
		{"empty hash", "bob:", `:1: user "bob": hash is not a bcrypt hash`, ""},
		{"unknown prefix", "bob:$2x$" + good[4:], `:1: user "bob": hash is not a bcrypt hash`, ""},
		{"md5 crypt", "bob:$1$abcdefgh$" + strings.Repeat("x", 22), `:1: user "bob": hash is not a bcrypt hash`, ""},
		{"truncated", "bob:" + good[:59], `:1: user "bob": hash is not a bcrypt hash`, ""},
		{"too long", "bob:" + good + "x", `:1: user "bob": hash is not a bcrypt hash`, ""},
		{"bad character", "bob:" + good[:40] + "!" + good[41:], `:1: user "bob": hash is not a bcrypt hash`, ""},
		{"cost not digits", "bob:$2a$1x" + good[6:], `:1: user "bob": hash is not a bcrypt hash`, ""},
		{"cost too low", "bob:$2a$03" + good[6:], `:1: user "bob": bcrypt cost 3 is outside bcrypt's range, 4 to 31`, ""},
		{"cost beyond bcrypt", "bob:$2a$99" + good[6:], `:1: user "bob": bcrypt cost 99 is outside bcrypt's range, 4 to 31`, ""},
		{"cost too high", "bob:$2a$15" + good[6:], `:1: user "bob": bcrypt cost 15 would take about 10s per check on a Pi Zero 2 W; use at most 14`, ""},
		{"duplicate", "bob:" + good + "\n# again\nbob:" + good + "\n", `:3: user "bob": duplicate of line 1; keep one entry`, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := writeFile(t, tt.content)
			p, err := LoadPasswords(path)
			if err == nil {
				t.Fatalf("LoadPasswords accepted the file, %d users", p.Len())
			}
			var ferr *FileError
			if !errors.As(err, &ferr) || !errors.Is(err, ErrInvalid) {
				t.Fatalf("error %T %v is not a *FileError wrapping ErrInvalid", err, err)
			}
			if len(ferr.Problems) != 1 {
				t.Fatalf("%d problems, want 1: %v", len(ferr.Problems), err)
			}
			if got := ferr.Problems[0].String(); !strings.HasPrefix(got, path+tt.want) {
				t.Errorf("problem\n\t%s\nwant it to begin\n\t%s", got, path+tt.want)
			}
			if tt.secret != "" && strings.Contains(err.Error(), tt.secret) {
				t.Errorf("error repeats %q, which may be a password: %v", tt.secret, err)
			}
		})
	}
}

func TestLoadPasswordsEveryProblem(t *testing.T) {
	good := hash(t, "pw")
	path := writeFile(t, strings.Join([]string{
		"# header",
		"alice:" + good,
		"alice:" + good,
		"bob:secret",
		"",
		"carol",
		"dave:" + good,
	}, "\n"))
	_, err := LoadPasswords(path)
	var ferr *FileError
	if !errors.As(err, &ferr) {
		t.Fatalf("error %v, want a *FileError", err)
	}
	var lines []int
	for _, p := range ferr.Problems {
		lines = append(lines, p.Line)
	}
	if fmt.Sprint(lines) != "[3 4 6]" {
		t.Errorf("problems on lines %v, want [3 4 6]:\n%v", lines, err)
	}
	msg := err.Error()
	if !strings.HasPrefix(msg, "auth: 3 problems:\n\t"+path+":3: ") || strings.Count(msg, "\n") != 3 {
		t.Errorf("error is not a count and one line per problem:\n%s", msg)
	}
}

func TestLoadPasswordsMissingFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "nothing-here")
	_, err := LoadPasswords(path)
	if !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), path) {
		t.Errorf("error %v, want one naming %s and wrapping fs.ErrNotExist", err, path)
	}
}

func TestLoadPasswordsEmpty(t *testing.T) {
	p := load(t, "# nobody yet\n")
	if p.Len() != 0 || p.Check("", []byte("x")) || p.Check("bob", []byte("x")) {
		t.Error("an empty file lets someone in")
	}
}

func TestDummyCost(t *testing.T) {
	tests := []struct {
		costs []int
		want  int
	}{
		{nil, HashCost},
		{[]int{4}, 4},
		{[]int{4, 5, 5}, 5},
		{[]int{6, 4, 6, 4}, 6}, // a tie goes to the dearer cost
	}
	for _, tt := range tests {
		var b strings.Builder
		for i, c := range tt.costs {
			fmt.Fprintf(&b, "u%d:%s\n", i, hashAt(t, "pw", c))
		}
		p := load(t, b.String())
		got, err := bcrypt.Cost([]byte(p.dummy))
		if err != nil {
			t.Fatalf("costs %v: dummy hash %q: %v", tt.costs, p.dummy, err)
		}
		if got != tt.want {
			t.Errorf("costs %v: dummy cost %d, want %d", tt.costs, got, tt.want)
		}
		if _, why := checkHash(p.dummy); why != "" {
			t.Errorf("dummy hash %q: %s", p.dummy, why)
		}
	}
}

func TestHashPasswordCost(t *testing.T) {
	// Not parallel: it restores the cost the other tests use.
	defer func(c int) { hashCost = c }(hashCost)
	hashCost = HashCost
	h, err := HashPassword([]byte("real cost"))
	if err != nil {
		t.Fatal(err)
	}
	if c, err := bcrypt.Cost([]byte(h)); err != nil || c != HashCost {
		t.Errorf("cost %d (%v), want %d", c, err, HashCost)
	}
	if err := bcrypt.CompareHashAndPassword([]byte(h), []byte("real cost")); err != nil {
		t.Error(err)
	}
	if _, why := checkHash(h); why != "" {
		t.Errorf("LoadPasswords would refuse the hash: %s", why)
	}
}

func TestHashPasswordRefuses(t *testing.T) {
	for _, tt := range []struct {
		password string
		want     error
	}{
		{"", ErrEmptyPassword},
		{strings.Repeat("x", MaxPasswordLen+1), ErrPasswordTooLong},
	} {
		if _, err := HashPassword([]byte(tt.password)); !errors.Is(err, tt.want) {
			t.Errorf("HashPassword(%d bytes): %v, want %v", len(tt.password), err, tt.want)
		}
	}
}

func TestValidateUsername(t *testing.T) {
	tests := []struct {
		user string
		ok   bool
	}{
		{"bob", true},
		{"pi user", true},
		{"Ünïcødé-名前", true},
		{"$SYS", true},
		{"a+b#c/d", true}, // the ACL, not the file, guards against these
		{strings.Repeat("x", MaxUsernameLen), true},
		{"", false},
		{"a:b", false},
		{"#bob", false},
		{"bo\nb", false},
		{"bob\x00", false},
		{"bob\u0085", false}, // C1 control
		{"b\xc3", false},
		{strings.Repeat("x", MaxUsernameLen+1), false},
	}
	for _, tt := range tests {
		err := ValidateUsername(tt.user)
		if (err == nil) != tt.ok {
			t.Errorf("ValidateUsername(%.20q) = %v, want ok %v", tt.user, err, tt.ok)
		}
		if err != nil && !errors.Is(err, ErrUsername) {
			t.Errorf("ValidateUsername(%.20q) = %v, not wrapping ErrUsername", tt.user, err)
		}
	}
}
