package apiserver

import (
	"crypto"
	"crypto/x509"
	"encoding/pem"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func parseCert(t *testing.T, data []byte) *x509.Certificate {
	t.Helper()
	b, _ := pem.Decode(data)
	if b == nil || b.Type != "CERTIFICATE" {
		t.Fatalf("no CERTIFICATE block in %q", data)
	}
	c, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		t.Fatalf("parse certificate: %v", err)
	}
	return c
}

func TestPKIChains(t *testing.T) {
	p, err := newPKI(time.Now())
	if err != nil {
		t.Fatalf("newPKI: %v", err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(parseCert(t, p.caCert))

	tests := []struct {
		name    string
		cert    []byte
		dnsName string
		usage   x509.ExtKeyUsage
		wantOrg []string
	}{
		{name: "serving cert for 127.0.0.1", cert: p.servingCert, dnsName: "127.0.0.1", usage: x509.ExtKeyUsageServerAuth},
		{name: "serving cert for the in-cluster name", cert: p.servingCert, dnsName: "kubernetes.default.svc", usage: x509.ExtKeyUsageServerAuth},
		{name: "admin client cert", cert: p.adminCert, usage: x509.ExtKeyUsageClientAuth, wantOrg: []string{"system:masters"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := parseCert(t, tc.cert)
			_, err := c.Verify(x509.VerifyOptions{Roots: roots, DNSName: tc.dnsName, KeyUsages: []x509.ExtKeyUsage{tc.usage}})
			if err != nil {
				t.Errorf("verify: %v", err)
			}
			if diff := cmp.Diff(tc.wantOrg, c.Subject.Organization); diff != "" {
				t.Errorf("subject organization (-want +got):\n%s", diff)
			}
		})
	}
}

func TestPKIKeysMatch(t *testing.T) {
	p, err := newPKI(time.Now())
	if err != nil {
		t.Fatalf("newPKI: %v", err)
	}
	keyOf := func(data []byte) any {
		b, _ := pem.Decode(data)
		k, err := x509.ParsePKCS8PrivateKey(b.Bytes)
		if err != nil {
			t.Fatalf("parse private key: %v", err)
		}
		return k.(crypto.Signer).Public()
	}
	b, _ := pem.Decode(p.saPublic)
	saPub, err := x509.ParsePKIXPublicKey(b.Bytes)
	if err != nil {
		t.Fatalf("parse service-account public key: %v", err)
	}
	pairs := []struct {
		name      string
		pub, priv any
	}{
		{"serving", parseCert(t, p.servingCert).PublicKey, keyOf(p.servingKey)},
		{"admin", parseCert(t, p.adminCert).PublicKey, keyOf(p.adminKey)},
		{"service account", saPub, keyOf(p.saPrivate)},
	}
	for _, pr := range pairs {
		if !pr.pub.(interface{ Equal(crypto.PublicKey) bool }).Equal(pr.priv) {
			t.Errorf("%s: public key does not match the private key", pr.name)
		}
	}
}
