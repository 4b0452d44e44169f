package auth

import (
	"os"
	"slices"
	"testing"
)

func TestReload(t *testing.T) {
	alice := "alice:" + hash(t, "a1") + "\n" // the same line in both files
	path := writeFile(t, alice+"bob:"+hash(t, "b1")+"\ncarol:"+hash(t, "c1")+"\n")
	p, err := NewAuthenticator().LoadPasswords(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range []string{"alice", "bob", "carol"} {
		if !p.Check(u, []byte(u[:1]+"1")) {
			t.Fatalf("%s's password refused before the reload", u)
		}
	}
	if n := p.auth.cache.len(); n != 3 {
		t.Fatalf("%d cached checks, want 3", n)
	}

	// bob's password changes, carol goes, dave comes.
	if err := os.WriteFile(path, []byte(alice+"bob:"+hash(t, "b2")+"\ndave:"+hash(t, "d1")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	next, c, err := p.Reload(path)
	if err != nil {
		t.Fatal(err)
	}
	want := Changes{Added: []string{"dave"}, Removed: []string{"carol"}, Changed: []string{"bob"}}
	if !slices.Equal(c.Added, want.Added) || !slices.Equal(c.Removed, want.Removed) || !slices.Equal(c.Changed, want.Changed) || c.Empty() {
		t.Errorf("changes %+v, want %+v", c, want)
	}
	// Only alice's check is still remembered: the reload forgot bob's
	// and carol's.
	if n := p.auth.cache.len(); n != 1 {
		t.Errorf("%d cached checks after the reload, want 1 (alice's)", n)
	}
	steps := []struct {
		user, password string
		want           bool
	}{
		{"alice", "a1", true},
		{"bob", "b1", false},
		{"bob", "b2", true},
		{"carol", "c1", false},
		{"dave", "d1", true},
	}
	for _, s := range steps {
		if got := next.Check(s.user, []byte(s.password)); got != s.want {
			t.Errorf("after the reload Check(%q, %q) = %v, want %v", s.user, s.password, got, s.want)
		}
	}
	for _, s := range []struct {
		user string
		want bool
	}{{"alice", true}, {"bob", false}, {"carol", false}, {"dave", false}} {
		if got := p.SameEntry(next, s.user); got != s.want {
			t.Errorf("SameEntry(%q) = %v, want %v", s.user, got, s.want)
		}
	}

	// A reload of an unchanged file changes nothing.
	again, c, err := next.Reload(path)
	if err != nil || !c.Empty() || again.Len() != 3 {
		t.Errorf("reloading an unchanged file: %+v, %d users, %v", c, again.Len(), err)
	}
}

func TestReloadBadFileKeepsUsers(t *testing.T) {
	path := writeFile(t, "alice:"+hash(t, "a1")+"\n")
	p, err := NewAuthenticator().LoadPasswords(path)
	if err != nil {
		t.Fatal(err)
	}
	if !p.Check("alice", []byte("a1")) {
		t.Fatal("alice refused")
	}
	if err := os.WriteFile(path, []byte("alice:not-a-hash\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if next, _, err := p.Reload(path); err == nil || next != nil {
		t.Fatalf("a bad file reloaded: %v, %v", next, err)
	}
	if !p.Check("alice", []byte("a1")) || p.auth.cache.len() != 1 {
		t.Error("a failed reload changed the running passwords or forgot their checks")
	}
}
