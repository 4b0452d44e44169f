// Package certs makes a throwaway certificate authority for a test: a CA,
// a server certificate for 127.0.0.1 and localhost, and a client
// certificate, as PEM files in the test's directory and as the values a
// Go TLS configuration takes. The broker's TLS listeners and the real
// mosquitto the bridge dials are both served from it.
package certs

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// PKI is one test's CA and the certificates it signed.
type PKI struct {
	CAFile                string         // the CA certificate, PEM
	ServerCert, ServerKey string         // the server certificate and its key (PKCS #8), PEM
	ClientCert, ClientKey string         // the client certificate and its key (PKCS #8), PEM
	Pool                  *x509.CertPool // holds the CA, for RootCAs or ClientCAs
	Client                tls.Certificate
}

// New makes a CA and its certificates in a new directory of the test's;
// the client certificate's common name is client (a broker may take it as
// the user name).
func New(t testing.TB, client string) *PKI {
	t.Helper()
	dir := t.TempDir()
	now := time.Now()
	newKey := func() *ecdsa.PrivateKey {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	serial := int64(1)
	template := func(cn string) *x509.Certificate {
		serial++
		return &x509.Certificate{
			SerialNumber: big.NewInt(serial),
			Subject:      pkix.Name{CommonName: cn, Organization: []string{"fieldgate test"}},
			NotBefore:    now.Add(-time.Hour),
			NotAfter:     now.Add(24 * time.Hour),
		}
	}
	write := func(name, kind string, der []byte) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	writeKey := func(name string, k *ecdsa.PrivateKey) string {
		der, err := x509.MarshalPKCS8PrivateKey(k)
		if err != nil {
			t.Fatal(err)
		}
		return write(name, "PRIVATE KEY", der)
	}

	caKey := newKey()
	caTmpl := template("fieldgate test CA")
	caTmpl.IsCA = true
	caTmpl.BasicConstraintsValid = true
	caTmpl.KeyUsage = x509.KeyUsageCertSign | x509.KeyUsageCRLSign
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	leaf := func(cn string, usage x509.ExtKeyUsage, edit func(*x509.Certificate)) ([]byte, *ecdsa.PrivateKey) {
		k := newKey()
		tmpl := template(cn)
		tmpl.KeyUsage = x509.KeyUsageDigitalSignature
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{usage}
		if edit != nil {
			edit(tmpl)
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &k.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		return der, k
	}
	srvDER, srvKey := leaf("localhost", x509.ExtKeyUsageServerAuth, func(c *x509.Certificate) {
		c.DNSNames = []string{"localhost"}
		c.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1)}
	})
	cliDER, cliKey := leaf(client, x509.ExtKeyUsageClientAuth, nil)
	p := &PKI{
		CAFile:     write("ca.pem", "CERTIFICATE", caDER),
		ServerCert: write("server.pem", "CERTIFICATE", srvDER),
		ServerKey:  writeKey("server.key", srvKey),
		ClientCert: write("client.pem", "CERTIFICATE", cliDER),
		ClientKey:  writeKey("client.key", cliKey),
		Pool:       x509.NewCertPool(),
		Client:     tls.Certificate{Certificate: [][]byte{cliDER}, PrivateKey: cliKey},
	}
	p.Pool.AddCert(ca)
	return p
}

// ClientTLS returns a client configuration that trusts the CA as its PEM
// file gives it (as a configured client would load it), for serverName,
// with the client certificate when withCert.
func (p *PKI) ClientTLS(t testing.TB, serverName string, withCert bool) *tls.Config {
	t.Helper()
	b, err := os.ReadFile(p.CAFile)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		t.Fatalf("no certificate in %s", p.CAFile)
	}
	cfg := &tls.Config{RootCAs: pool, ServerName: serverName, MinVersion: tls.VersionTLS12}
	if withCert {
		cert, err := tls.LoadX509KeyPair(p.ClientCert, p.ClientKey)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg
}
