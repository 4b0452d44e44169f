package mosquitto

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

// CAFile returns the PEM file of the test CA.
func (m *Broker) CAFile() string { return m.certs.caFile }

// ClientCertFiles returns the PEM files of the test client certificate
// and its key, which the TLS listener accepts.
func (m *Broker) ClientCertFiles() (cert, key string) {
	return m.certs.clientCert, m.certs.clientKey
}

// ClientTLS returns a client configuration trusting the test CA as a file
// names it, with serverName, and with the test client certificate when
// withCert.
func (m *Broker) ClientTLS(serverName string, withCert bool) *tls.Config {
	m.t.Helper()
	pem, err := os.ReadFile(m.certs.caFile)
	if err != nil {
		m.t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		m.t.Fatalf("no certificate in %s", m.certs.caFile)
	}
	cfg := &tls.Config{RootCAs: pool, ServerName: serverName, MinVersion: tls.VersionTLS12}
	if withCert {
		cert, err := tls.LoadX509KeyPair(m.certs.clientCert, m.certs.clientKey)
		if err != nil {
			m.t.Fatal(err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg
}

// certs are the PEM files of a CA, a server certificate for 127.0.0.1
// and localhost, and a client certificate, all made for one test.
type certs struct {
	caFile                string
	serverCert, serverKey string
	clientCert, clientKey string
}

// makeCerts makes them in dir.
func makeCerts(t testing.TB, dir string) *certs {
	t.Helper()
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
	cliDER, cliKey := leaf("gateway-1", x509.ExtKeyUsageClientAuth, nil)
	return &certs{
		caFile:     write("ca.pem", "CERTIFICATE", caDER),
		serverCert: write("server.pem", "CERTIFICATE", srvDER),
		serverKey:  writeKey("server.key", srvKey),
		clientCert: write("client.pem", "CERTIFICATE", cliDER),
		clientKey:  writeKey("client.key", cliKey),
	}
}
