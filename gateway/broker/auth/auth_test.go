package auth

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/crypto/bcrypt"
)

func TestMain(m *testing.M) {
	// The cheapest cost bcrypt allows keeps the tests fast, above all
	// under -race; TestHashPasswordCost checks the real one.
	hashCost = bcrypt.MinCost
	os.Exit(m.Run())
}

func (c *cache) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.m)
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

func TestCheck(t *testing.T) {
	p := load(t, "bob:"+hash(t, "right")+"\nmax:"+hash(t, strings.Repeat("m", MaxPasswordLen))+"\n")
	p.cache = newCache(cacheSize)
	long := strings.Repeat("m", MaxPasswordLen)
	steps := []struct {
		name, user, password string
		want                 bool
	}{
		{"unknown user", "alice", "right", false},
		{"wrong password", "bob", "wrong", false},
		{"right password", "bob", "right", true},
		{"wrong password after a cached success", "bob", "wrong", false},
		{"prefix of the right password", "bob", "righ", false},
		{"right password, cached", "bob", "right", true},
		{"empty password", "bob", "", false},
		{"empty username", "", "right", false},
		{"72 bytes", "max", long, true},
		// bcrypt ignores bytes past 72, so this would match.
		{"73 bytes", "max", long + "x", false},
	}
	for _, s := range steps {
		if got := p.Check(s.user, []byte(s.password)); got != s.want {
			t.Errorf("%s: Check(%q, %q) = %v, want %v", s.name, s.user, s.password, got, s.want)
		}
	}
	var nilP *Passwords
	if nilP.Check("bob", []byte("right")) || nilP.Len() != 0 {
		t.Error("a nil *Passwords lets someone in")
	}
}

// holdSlots takes every bcrypt slot, so that a Check that needs bcrypt
// blocks until the returned function gives them back.
func holdSlots() (release func()) {
	for range cap(bcryptSlots) {
		bcryptSlots <- struct{}{}
	}
	return func() {
		for range cap(bcryptSlots) {
			<-bcryptSlots
		}
	}
}

// checkAsync runs Check in a goroutine and returns its result channel.
func checkAsync(p *Passwords, user, password string) <-chan bool {
	c := make(chan bool, 1)
	go func() { c <- p.Check(user, []byte(password)) }()
	return c
}

func TestCheckCacheSkipsBcrypt(t *testing.T) {
	p := load(t, "bob:"+hash(t, "right")+"\n")
	p.cache = newCache(cacheSize)
	if !p.Check("bob", []byte("right")) {
		t.Fatal("right password refused")
	}

	release := holdSlots()
	select {
	case ok := <-checkAsync(p, "bob", "right"):
		if !ok {
			t.Error("cached password refused")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a cached check waited for a bcrypt slot")
	}

	// Anything else needs bcrypt, for known and unknown users alike, and
	// waits for a slot.
	wrong, unknown := checkAsync(p, "bob", "wrong"), checkAsync(p, "nobody", "right")
	select {
	case <-wrong:
		t.Error("a wrong password was judged without bcrypt")
	case <-unknown:
		t.Error("an unknown user was judged without bcrypt")
	case <-time.After(50 * time.Millisecond):
	}
	release()
	if <-wrong || <-unknown {
		t.Error("wrong password or unknown user accepted")
	}
}

func TestCheckCacheFollowsHash(t *testing.T) {
	path := writeFile(t, "bob:"+hash(t, "old")+"\n")
	p, err := LoadPasswords(path)
	if err != nil {
		t.Fatal(err)
	}
	if !p.Check("bob", []byte("old")) {
		t.Fatal("right password refused")
	}
	if err := SetPassword(path, "bob", []byte("new")); err != nil {
		t.Fatal(err)
	}
	reloaded, err := LoadPasswords(path)
	if err != nil {
		t.Fatal(err)
	}
	if reloaded.cache != p.cache {
		t.Fatal("a reload does not share the process's cache")
	}
	if reloaded.Check("bob", []byte("old")) {
		t.Error("the old password still works after a change, from the cache")
	}
	if !reloaded.Check("bob", []byte("new")) {
		t.Error("the new password is refused")
	}
	// The old Passwords still holds the old hash, and its cache entry
	// was replaced: it pays bcrypt again but stays correct.
	if !p.Check("bob", []byte("old")) || p.Check("bob", []byte("new")) {
		t.Error("the old Passwords changed its answers")
	}
}

func TestCheckCacheBound(t *testing.T) {
	const users, bound = 12, 5
	var b strings.Builder
	for i := range users {
		fmt.Fprintf(&b, "user%d:%s\n", i, hash(t, fmt.Sprint("pw", i)))
	}
	p := load(t, b.String())
	p.cache = newCache(bound)
	for round := range 3 {
		for i := range users {
			if !p.Check(fmt.Sprint("user", i), []byte(fmt.Sprint("pw", i))) {
				t.Fatalf("round %d: user%d refused", round, i)
			}
			if n := p.cache.len(); n > bound {
				t.Fatalf("cache holds %d entries, bound %d", n, bound)
			}
			if p.Check(fmt.Sprint("user", i), []byte("wrong")) {
				t.Fatalf("round %d: user%d accepted with a wrong password", round, i)
			}
		}
	}
	if n := p.cache.len(); n != bound {
		t.Errorf("cache holds %d entries, want it full at %d", n, bound)
	}
}

func TestCheckConcurrent(t *testing.T) {
	const users = 6
	var b strings.Builder
	for i := range users {
		fmt.Fprintf(&b, "user%d:%s\n", i, hash(t, fmt.Sprint("pw", i)))
	}
	p := load(t, b.String())
	// A cache smaller than the user count keeps evicting under contention.
	p.cache = newCache(users / 2)

	var wg sync.WaitGroup
	errs := make(chan string, 64)
	for g := range 8 {
		wg.Go(func() {
			for i := range 16 {
				u := (g + i) % (users + 1) // user6 does not exist
				user, pw := fmt.Sprint("user", u), fmt.Sprint("pw", u)
				want := u < users
				if got := p.Check(user, []byte(pw)); got != want {
					errs <- fmt.Sprintf("Check(%s, right) = %v, want %v", user, got, want)
				}
				if p.Check(user, []byte(pw+"x")) {
					errs <- fmt.Sprintf("Check(%s, wrong) = true", user)
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
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

// mustCheck loads the password file and checks one password in it.
func mustCheck(t *testing.T, path, user, password string) {
	t.Helper()
	p, err := LoadPasswords(path)
	if err != nil {
		t.Fatal(err)
	}
	if !p.Check(user, []byte(password)) {
		t.Errorf("%s: password of %q refused", path, user)
	}
}

func TestSetPasswordCreates(t *testing.T) {
	path := filepath.Join(t.TempDir(), "passwd")
	if err := SetPassword(path, "alice", []byte("wonderland")); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("new file mode %v, want 0600", fi.Mode().Perm())
	}
	content := readFile(t, path)
	if !strings.HasPrefix(content, "alice:$2a$") || strings.Count(content, "\n") != 1 || !strings.HasSuffix(content, "\n") {
		t.Errorf("new file holds %q, want one line alice:hash", content)
	}
	mustCheck(t, path, "alice", "wonderland")
	noTempFiles(t, filepath.Dir(path))
}

func noTempFiles(t *testing.T, dir string) {
	t.Helper()
	names, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		if strings.HasSuffix(n.Name(), ".tmp") {
			t.Errorf("temporary file %s left behind", n.Name())
		}
	}
}

func TestSetPasswordKeepsOtherLines(t *testing.T) {
	bob, carol := hash(t, "bob"), hash(t, "carol")
	tests := []struct {
		name   string
		before string
		user   string
		want   func(entry string) string // the file after, given the new entry
	}{
		{"replace in the middle",
			"# users\n\nbob:" + bob + "\n  \ncarol:" + carol + "\n",
			"bob",
			func(e string) string { return "# users\n\n" + e + "\n  \ncarol:" + carol + "\n" }},
		{"replace a CRLF line",
			"bob:" + bob + "\r\ncarol:" + carol + "\r\n",
			"bob",
			func(e string) string { return e + "\r\ncarol:" + carol + "\r\n" }},
		{"replace the last line without newline",
			"carol:" + carol + "\nbob:" + bob,
			"bob",
			func(e string) string { return "carol:" + carol + "\n" + e + "\n" }},
		{"replace a bad line and drop a duplicate",
			"bob:plaintext\ncarol:" + carol + "\nbob:" + bob + "\n",
			"bob",
			func(e string) string { return e + "\ncarol:" + carol + "\n" }},
		{"add at the end",
			"# users\ncarol:" + carol + "\n",
			"dave",
			func(e string) string { return "# users\ncarol:" + carol + "\n" + e + "\n" }},
		{"add after a last line without newline",
			"carol:" + carol,
			"dave",
			func(e string) string { return "carol:" + carol + "\n" + e + "\n" }},
		{"a commented-out entry stays",
			"#dave:" + bob + "\n",
			"dave",
			func(e string) string { return "#dave:" + bob + "\n" + e + "\n" }},
		{"empty file",
			"",
			"dave",
			func(e string) string { return e + "\n" }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := writeFile(t, tt.before)
			if err := SetPassword(path, tt.user, []byte("new")); err != nil {
				t.Fatal(err)
			}
			after := readFile(t, path)
			var entry string
			for _, line := range strings.Split(after, "\n") {
				if strings.HasPrefix(line, tt.user+":") {
					entry = strings.TrimSuffix(line, "\r")
				}
			}
			if want := tt.want(entry); after != want {
				t.Errorf("file after:\n%q\nwant:\n%q", after, want)
			}
			mustCheck(t, path, tt.user, "new")
			noTempFiles(t, filepath.Dir(path))
		})
	}
}

func TestSetPasswordKeepsModeAndLink(t *testing.T) {
	dir := t.TempDir()
	real := filepath.Join(dir, "real-passwd")
	if err := os.WriteFile(real, []byte("carol:"+hash(t, "c")+"\n"), 0o640); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(real, 0o640); err != nil { // whatever the umask
		t.Fatal(err)
	}
	link := filepath.Join(dir, "passwd")
	if err := os.Symlink("real-passwd", link); err != nil {
		t.Fatal(err)
	}
	if err := SetPassword(link, "bob", []byte("b")); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Lstat(link); err != nil || fi.Mode()&fs.ModeSymlink == 0 {
		t.Errorf("the link was replaced by a file (%v)", err)
	}
	fi, err := os.Stat(real)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o640 {
		t.Errorf("mode %v, want the file's 0640 kept", fi.Mode().Perm())
	}
	mustCheck(t, real, "bob", "b")
	mustCheck(t, real, "carol", "c")
}

func TestSetPasswordKeepsOwner(t *testing.T) {
	path := writeFile(t, "carol:"+hash(t, "c")+"\n")
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	uid, gid, ok := owner(fi)
	if !ok {
		t.Skip("this platform does not record file owners")
	}
	if uid != os.Getuid() || gid != os.Getgid() {
		t.Fatalf("owner reads %d:%d, want %d:%d", uid, gid, os.Getuid(), os.Getgid())
	}
	if os.Getuid() != 0 {
		t.Skip("only root can give a file to another owner")
	}
	// What the service user would own, edited by root.
	const svcUID, svcGID = 4242, 4343
	if err := os.Chown(path, svcUID, svcGID); err != nil {
		t.Fatal(err)
	}
	if err := SetPassword(path, "bob", []byte("b")); err != nil {
		t.Fatal(err)
	}
	if fi, err = os.Stat(path); err != nil {
		t.Fatal(err)
	}
	if uid, gid, _ = owner(fi); uid != svcUID || gid != svcGID {
		t.Errorf("owner %d:%d after the edit, want %d:%d kept", uid, gid, svcUID, svcGID)
	}
}

func TestSetPasswordRefuses(t *testing.T) {
	path := writeFile(t, "# untouched\n")
	tests := []struct {
		user, password string
		want           error
	}{
		{"a:b", "pw", ErrUsername},
		{"", "pw", ErrUsername},
		{"#x", "pw", ErrUsername},
		{"new\nline", "pw", ErrUsername},
		{"bob", "", ErrEmptyPassword},
		{"bob", strings.Repeat("p", 73), ErrPasswordTooLong},
	}
	for _, tt := range tests {
		err := SetPassword(path, tt.user, []byte(tt.password))
		if !errors.Is(err, tt.want) {
			t.Errorf("SetPassword(%q): %v, want %v", tt.user, err, tt.want)
			continue
		}
		if !strings.Contains(err.Error(), path) {
			t.Errorf("error %q does not name the file", err)
		}
	}
	if got := readFile(t, path); got != "# untouched\n" {
		t.Errorf("file changed to %q", got)
	}
	missing := filepath.Join(t.TempDir(), "passwd")
	if err := SetPassword(missing, "a:b", []byte("pw")); err == nil {
		t.Error("bad username accepted")
	}
	if _, err := os.Stat(missing); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a refused entry created the file (%v)", err)
	}
}

func TestDeleteUser(t *testing.T) {
	bob, carol := hash(t, "bob"), hash(t, "carol")
	path := writeFile(t, "# users\nbob:"+bob+"\r\n\ncarol:"+carol+"\nbob:"+bob)
	if err := DeleteUser(path, "bob"); err != nil {
		t.Fatal(err)
	}
	if got, want := readFile(t, path), "# users\n\ncarol:"+carol+"\n"; got != want {
		t.Errorf("after delete:\n%q\nwant:\n%q", got, want)
	}
	mustCheck(t, path, "carol", "carol")

	err := DeleteUser(path, "bob")
	if !errors.Is(err, ErrNoUser) || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), `"bob"`) {
		t.Errorf("deleting an absent user: %v, want ErrNoUser naming the file and user", err)
	}
	missing := filepath.Join(t.TempDir(), "passwd")
	err = DeleteUser(missing, "bob")
	if !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), missing) {
		t.Errorf("deleting from a missing file: %v, want fs.ErrNotExist naming it", err)
	}
	if _, err := os.Stat(missing); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("DeleteUser created the file (%v)", err)
	}
	noTempFiles(t, filepath.Dir(path))
}

func BenchmarkCheckCached(b *testing.B) {
	p := load(b, "bob:"+hash(b, "right")+"\n")
	p.Check("bob", []byte("right"))
	pw := []byte("right")
	b.ReportAllocs()
	for b.Loop() {
		if !p.Check("bob", pw) {
			b.Fatal("refused")
		}
	}
}
