package certs

import (
	"crypto/tls"
	"crypto/x509"
	"net"
	"testing"
	"time"

	"github.com/fieldgate/fieldgate/internal/testkit"
)

// TestHandshake serves the server certificate, asking for a client
// certificate signed by the CA, and checks that a client with the
// ClientTLS configuration, by IP address and by name, completes the
// handshake and is seen under its common name.
func TestHandshake(t *testing.T) {
	p := New(t, "sensor-7")
	srv, err := tls.LoadX509KeyPair(p.ServerCert, p.ServerKey)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{srv}, ClientCAs: p.Pool, ClientAuth: tls.RequireAndVerifyClientCert})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	seen := make(chan string, 2)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			tc := c.(*tls.Conn)
			_ = tc.SetDeadline(time.Now().Add(testkit.Scale(10 * time.Second)))
			if err := tc.Handshake(); err == nil {
				seen <- tc.ConnectionState().PeerCertificates[0].Subject.CommonName
			}
			c.Close()
		}
	}()
	for _, name := range []string{"127.0.0.1", "localhost"} {
		d := net.Dialer{Timeout: testkit.Scale(10 * time.Second)}
		c, err := tls.DialWithDialer(&d, "tcp", ln.Addr().String(), p.ClientTLS(t, name, true))
		if err != nil {
			t.Fatalf("server name %s: %v", name, err)
		}
		c.Close()
		select {
		case cn := <-seen:
			if cn != "sensor-7" {
				t.Fatalf("client seen as %q, want sensor-7", cn)
			}
		case <-time.After(testkit.Scale(10 * time.Second)):
			t.Fatal("the server saw no handshake")
		}
	}
	if _, err := x509.ParseCertificate(p.Client.Certificate[0]); err != nil {
		t.Fatalf("Client: %v", err)
	}
}
