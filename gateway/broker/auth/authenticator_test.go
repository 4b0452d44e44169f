package auth

import (
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fieldgate/fieldgate/internal/testkit"
)

func (c *cache) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.m)
}

func TestCheck(t *testing.T) {
	p := load(t, "bob:"+hash(t, "right")+"\nmax:"+hash(t, strings.Repeat("m", MaxPasswordLen))+"\n")
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

// holdSlots takes every bcrypt slot of a, so that a Check through a that
// needs bcrypt blocks until the returned function gives them back.
func holdSlots(a *Authenticator) (release func()) {
	a.slots.mu.Lock()
	n := a.slots.free
	a.slots.free = 0
	a.slots.mu.Unlock()
	return func() {
		for range n {
			a.slots.release()
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
	if !p.Check("bob", []byte("right")) {
		t.Fatal("right password refused")
	}

	release := holdSlots(p.auth)
	select {
	case ok := <-checkAsync(p, "bob", "right"):
		if !ok {
			t.Error("cached password refused")
		}
	case <-time.After(testkit.Scale(10 * time.Second)):
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
	a := NewAuthenticator()
	p, err := a.LoadPasswords(path)
	if err != nil {
		t.Fatal(err)
	}
	if !p.Check("bob", []byte("old")) {
		t.Fatal("right password refused")
	}
	if err := SetPassword(path, "bob", []byte("new")); err != nil {
		t.Fatal(err)
	}
	reloaded, err := a.LoadPasswords(path)
	if err != nil {
		t.Fatal(err)
	}
	if reloaded.auth.cache != p.auth.cache {
		t.Fatal("a reload through the same Authenticator does not share its cache")
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

// TestAuthenticatorBound checks that every password file loaded through one
// Authenticator waits for its bcrypt slots, and one with its own does not.
func TestAuthenticatorBound(t *testing.T) {
	a := NewAuthenticator()
	if want := max(1, runtime.NumCPU()-1); a.slots.free != want || a.cache.max != cacheSize {
		t.Errorf("%d slots and a cache of %d; want %d (one CPU left for routing) and %d", a.slots.free, a.cache.max, want, cacheSize)
	}
	path := writeFile(t, "bob:"+hash(t, "right")+"\n")
	p1, err := a.LoadPasswords(path)
	if err != nil {
		t.Fatal(err)
	}
	p2, err := a.LoadPasswords(path)
	if err != nil {
		t.Fatal(err)
	}
	own, err := LoadPasswords(path)
	if err != nil {
		t.Fatal(err)
	}

	release := holdSlots(a)
	c1, c2 := checkAsync(p1, "bob", "right"), checkAsync(p2, "bob", "right")
	select {
	case ok := <-checkAsync(own, "bob", "right"):
		if !ok {
			t.Error("right password refused")
		}
	case <-time.After(testkit.Scale(10 * time.Second)):
		t.Fatal("a password file with an Authenticator of its own waited for another's slots")
	}
	select {
	case <-c1:
		t.Error("a check went past its Authenticator's bound")
	case <-c2:
		t.Error("a check of a second file went past the Authenticator's bound")
	case <-time.After(50 * time.Millisecond):
	}
	release()
	if !<-c1 || !<-c2 {
		t.Error("right password refused")
	}
}

func TestCheckCacheBound(t *testing.T) {
	const users, bound = 12, 5
	var b strings.Builder
	for i := range users {
		fmt.Fprintf(&b, "user%d:%s\n", i, hash(t, fmt.Sprint("pw", i)))
	}
	p := load(t, b.String())
	p.auth.cache = newCache(bound)
	for round := range 3 {
		for i := range users {
			if !p.Check(fmt.Sprint("user", i), []byte(fmt.Sprint("pw", i))) {
				t.Fatalf("round %d: user%d refused", round, i)
			}
			if n := p.auth.cache.len(); n > bound {
				t.Fatalf("cache holds %d entries, bound %d", n, bound)
			}
			if p.Check(fmt.Sprint("user", i), []byte("wrong")) {
				t.Fatalf("round %d: user%d accepted with a wrong password", round, i)
			}
		}
	}
	if n := p.auth.cache.len(); n != bound {
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
	p.auth.cache = newCache(users / 2)

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
