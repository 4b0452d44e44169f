package check

import (
	"strings"
	"testing"
)

// TestWhereAndEither checks how one key is named in a message about
// another: with its line when the file wrote it, "(by default)" when a
// file left it out, bare for a configuration built in code.
func TestWhereAndEither(t *testing.T) {
	file := New(map[string]int{"": 1, "a": 2, "b.c": 5}, true)
	for path, want := range map[string]string{"a": "a (line 2)", "b.c": "b.c (line 5)", "b.d": "b.d (by default)"} {
		if got := file.Where(path); got != want {
			t.Errorf("Where(%q) = %q, want %q", path, got, want)
		}
	}
	if got := New(nil, false).Where("a"); got != "a" {
		t.Errorf("Where in code = %q, want the bare path", got)
	}
	for _, tc := range []struct{ first, second, want string }{
		{"a", "b.c", "a"},   // both written: the first
		{"x", "b.c", "b.c"}, // only the second written
		{"x", "y", "x"},     // neither
	} {
		if got := file.Either(tc.first, tc.second); got != tc.want {
			t.Errorf("Either(%q, %q) = %q, want %q", tc.first, tc.second, got, tc.want)
		}
	}
}

func TestClaim(t *testing.T) {
	for _, tc := range []struct {
		name   string
		claims [][3]string // path, network, addr
		want   string      // the one problem, as path: message; "" for none
	}{
		{"distinct ports", [][3]string{{"a", "tcp", ":1883"}, {"b", "tcp", ":1884"}}, ""},
		{"wildcard and loopback", [][3]string{{"a", "tcp", ":1883"}, {"b", "tcp", "127.0.0.1:1883"}},
			"b: 127.0.0.1:1883 is also bound by a (line 2); give each its own address"},
		{"two hosts", [][3]string{{"a", "tcp", "10.0.0.1:1883"}, {"b", "tcp", "127.0.0.1:1883"}}, ""},
		{"port 0 twice", [][3]string{{"a", "tcp", "127.0.0.1:0"}, {"b", "tcp", "127.0.0.1:0"}}, ""},
		{"unix path twice", [][3]string{{"a", "unix", "/run/s"}, {"b", "unix", "/run/s"}},
			"b: /run/s is also bound by a (line 2); give each its own address"},
		{"tcp and unix", [][3]string{{"a", "tcp", ":1883"}, {"b", "unix", ":1883"}}, ""},
		{"a default clashes with what was written", [][3]string{{"a", "tcp", ":9100"}, {"c", "tcp", "127.0.0.1:9100"}},
			"a: :9100 is also bound by c (by default); give each its own address"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k := New(map[string]int{"": 1, "a": 2, "b": 3}, true)
			for _, c := range tc.claims {
				k.Claim(c[0], c[1], c[2])
			}
			got := ""
			if ps := k.Problems(); len(ps) == 1 {
				got = ps[0].Path + ": " + ps[0].Msg
			} else if len(ps) > 1 {
				t.Fatalf("problems = %+v, want at most one", ps)
			}
			if got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}

func TestName(t *testing.T) {
	k := New(map[string]int{"": 1, "xs[0]": 2, "xs[0].name": 2}, true)
	seen := map[string]string{}
	for _, tc := range []struct{ path, name, want string }{
		{"xs[0].name", "pump-1", ""},
		{"xs[1].name", "", "required: a short unique name"},
		{"xs[2].name", "a/b", `"a/b" contains '/'; use letters, digits, - and _`},
		{"xs[3].name", strings.Repeat("a", 65), "is 65 characters long; use at most 64"},
		{"xs[4].name", "pump-1", `"pump-1" is already the name of xs[0] (line 2); names must be unique`},
	} {
		before := len(k.Problems())
		k.Name(tc.path, tc.name, seen)
		ps := k.Problems()[before:]
		switch {
		case tc.want == "" && len(ps) > 0:
			t.Errorf("Name(%q) = %+v, want no problem", tc.name, ps)
		case tc.want != "" && (len(ps) != 1 || ps[0].Path != tc.path || !strings.Contains(ps[0].Msg, tc.want)):
			t.Errorf("Name(%q) = %+v, want one problem at %s containing %q", tc.name, ps, tc.path, tc.want)
		}
	}
}

func TestValues(t *testing.T) {
	k := New(nil, false)
	if !k.HostPort("a", "127.0.0.1:1883", "127.0.0.1:1883") || k.HostPort("b", "127.0.0.1", "127.0.0.1:1883") || k.HostPort("c", ":http", "127.0.0.1:8080") {
		t.Error("HostPort accepted a bad address or refused a good one")
	}
	k.IntRange("d", 3, 0, 2, "1")
	k.IntRange("e", 2, 0, 2, "1")
	k.OneOf("f", "maybe", "off", "on")
	k.OneOf("g", "on", "off", "on")
	want := []Problem{
		{"b", `"127.0.0.1" is not host:port; use something like 127.0.0.1:1883, or :1883 for every interface`},
		{"c", `port "http" is not a number from 0 to 65535; use something like 127.0.0.1:8080`},
		{"d", "3 is out of range; use 0 to 2, such as 1"},
		{"f", `"maybe" is not allowed; use one of off, on`},
	}
	got := k.Problems()
	if len(got) != len(want) {
		t.Fatalf("problems = %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("problem %d = %+v, want %+v", i, got[i], want[i])
		}
	}
}
