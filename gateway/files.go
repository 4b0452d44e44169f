package gateway

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"

	"github.com/fieldgate/fieldgate/gateway/broker"
	"github.com/fieldgate/fieldgate/gateway/broker/auth"
	"github.com/fieldgate/fieldgate/gateway/config"
)

// checkFiles reads every file the configuration names (certificates,
// keys, CA bundles, password files) before anything else starts, so that
// a file that cannot be read or parsed is reported with its key and line
// and the gateway refuses to start without having created or touched its
// state file. `fieldgate check` does not open them: a systemd credential
// exists only for the running service.
func checkFiles(cfg *config.Config) error {
	var ps []config.Problem
	bad := func(path, format string, args ...any) {
		ps = append(ps, cfg.Problem(path, format, args...))
	}
	pair := func(key, cert, keyFile string) {
		if cert == "" && keyFile == "" {
			return
		}
		if _, err := tls.LoadX509KeyPair(cert, keyFile); err != nil {
			bad(key+".cert", "the certificate %s and key %s cannot be used: %v", cert, keyFile, err)
		}
	}
	roots := func(key, path string) {
		if path == "" {
			return
		}
		pem, err := os.ReadFile(path)
		if err != nil {
			bad(key, "%v", err)
			return
		}
		if !x509.NewCertPool().AppendCertsFromPEM(pem) {
			bad(key, "%s holds no PEM certificate", path)
		}
	}
	for i, l := range cfg.Listeners {
		if l.Type != broker.ListenerTLS && l.Type != broker.ListenerWSS {
			continue
		}
		p := fmt.Sprintf("listeners[%d].tls", i)
		pair(p, l.TLS.Cert, l.TLS.Key)
		roots(p+".client_ca", l.TLS.ClientCA)
	}
	if path := cfg.Broker.PasswordFile; path != "" {
		if _, err := auth.LoadPasswords(path); err != nil {
			bad("broker.password_file", "%v", err)
		}
	}
	for i, b := range cfg.Bridges {
		p := fmt.Sprintf("bridges[%d]", i)
		if b.PasswordFile != "" {
			if _, err := os.ReadFile(b.PasswordFile); err != nil {
				bad(p+".password_file", "%v", err)
			}
		}
		if b.TLS.Enabled {
			roots(p+".tls.ca_file", b.TLS.CAFile)
			pair(p+".tls", b.TLS.Cert, b.TLS.Key)
		}
	}
	if len(ps) == 0 {
		return nil
	}
	return &config.Error{Problems: ps}
}
