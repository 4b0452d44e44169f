package broker

import "testing"

// TestCheckPassword checks the password check the broker lends the ops
// endpoint: it answers from the broker's password file, and refuses
// everyone without one.
func TestCheckPassword(t *testing.T) {
	passwd := writePasswordFile(t, "alice", "s3cret")
	locked := startBroker(t, func(o *Options) { o.PasswordFile = passwd })
	for _, c := range []struct {
		user, password string
		want           bool
	}{
		{"alice", "s3cret", true},
		{"alice", "s3cret", true}, // remembered
		{"alice", "wrong", false},
		{"bob", "s3cret", false},
		{"alice", "", false},
	} {
		if got := locked.CheckPassword(c.user, []byte(c.password)); got != c.want {
			t.Errorf("CheckPassword(%q, %q) = %v, want %v", c.user, c.password, got, c.want)
		}
	}
	open := startBroker(t, nil)
	if open.CheckPassword("alice", []byte("s3cret")) {
		t.Error("a broker without a password file accepted a password")
	}
}
