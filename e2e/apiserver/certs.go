package apiserver

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// pki holds the PEM material a Server hands to its processes and clients.
type pki struct {
	caCert                  []byte
	servingCert, servingKey []byte
	adminCert, adminKey     []byte
	saPublic, saPrivate     []byte
}

// Paths of the PEM files inside a Server's directory.
const (
	caCertFile      = "ca.crt"
	servingCertFile = "apiserver.crt"
	servingKeyFile  = "apiserver.key"
	adminCertFile   = "admin.crt"
	adminKeyFile    = "admin.key"
	saPublicFile    = "sa.pub"
	saPrivateFile   = "sa.key"
)

// newPKI makes a throwaway CA, a serving certificate for 127.0.0.1 and the
// in-cluster names, an admin client certificate and a service-account key.
func newPKI(now time.Time) (*pki, error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate CA key: %w", err)
	}
	caTmpl := &x509.Certificate{
		Subject:               pkix.Name{CommonName: "nftproxy-e2e-ca"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(7 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caPEM, caCert, err := sign(caTmpl, caTmpl, caKey.Public(), caKey)
	if err != nil {
		return nil, fmt.Errorf("sign CA certificate: %w", err)
	}
	p := &pki{caCert: caPEM}

	p.servingCert, p.servingKey, err = leaf(caCert, caKey, &x509.Certificate{
		Subject:     pkix.Name{CommonName: "kube-apiserver"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		// 10.96.0.1 is the kubernetes Service's ClusterIP in 10.96.0.0/16;
		// 172.20.0.1 the relay's address in e2e/netns's cluster fabric, for
		// clients that do not take a kubeconfig's tls-server-name (e2e.test).
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv4(10, 96, 0, 1), net.IPv4(172, 20, 0, 1)},
		DNSNames: []string{
			"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
			"kubernetes.default.svc.cluster.local",
		},
	}, now)
	if err != nil {
		return nil, fmt.Errorf("make serving certificate: %w", err)
	}
	p.adminCert, p.adminKey, err = leaf(caCert, caKey, &x509.Certificate{
		// The group system:masters is bound to cluster-admin by RBAC's bootstrap policy.
		Subject:     pkix.Name{CommonName: "admin", Organization: []string{"system:masters"}},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}, now)
	if err != nil {
		return nil, fmt.Errorf("make admin certificate: %w", err)
	}

	saKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return nil, fmt.Errorf("generate service-account key: %w", err)
	}
	if p.saPrivate, err = keyPEM(saKey); err != nil {
		return nil, fmt.Errorf("encode service-account key: %w", err)
	}
	pub, err := x509.MarshalPKIXPublicKey(saKey.Public())
	if err != nil {
		return nil, fmt.Errorf("encode service-account public key: %w", err)
	}
	p.saPublic = pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub})
	return p, nil
}

// leaf signs tmpl with the CA under a fresh key and returns certificate and key as PEM.
func leaf(ca *x509.Certificate, caKey crypto.Signer, tmpl *x509.Certificate, now time.Time) (certPEM, keyPEMBytes []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("generate key: %w", err)
	}
	tmpl.NotBefore = now.Add(-time.Hour)
	tmpl.NotAfter = now.Add(7 * 24 * time.Hour)
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	certPEM, _, err = sign(tmpl, ca, key.Public(), caKey)
	if err != nil {
		return nil, nil, err
	}
	keyPEMBytes, err = keyPEM(key)
	if err != nil {
		return nil, nil, fmt.Errorf("encode key: %w", err)
	}
	return certPEM, keyPEMBytes, nil
}

// sign issues tmpl with a random serial and returns it as PEM and parsed.
func sign(tmpl, parent *x509.Certificate, pub crypto.PublicKey, signer crypto.Signer) ([]byte, *x509.Certificate, error) {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return nil, nil, fmt.Errorf("pick serial: %w", err)
	}
	tmpl.SerialNumber = serial
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, pub, signer)
	if err != nil {
		return nil, nil, fmt.Errorf("create certificate %q: %w", tmpl.Subject.CommonName, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, fmt.Errorf("parse certificate %q: %w", tmpl.Subject.CommonName, err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), cert, nil
}

func keyPEM(key crypto.Signer) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

// write stores every file under dir, private keys readable by the owner only.
func (p *pki) write(dir string) error {
	files := []struct {
		name string
		data []byte
	}{
		{caCertFile, p.caCert},
		{servingCertFile, p.servingCert},
		{servingKeyFile, p.servingKey},
		{adminCertFile, p.adminCert},
		{adminKeyFile, p.adminKey},
		{saPublicFile, p.saPublic},
		{saPrivateFile, p.saPrivate},
	}
	for _, f := range files {
		if err := os.WriteFile(filepath.Join(dir, f.name), f.data, 0o600); err != nil {
			return fmt.Errorf("write %s: %w", f.name, err)
		}
	}
	return nil
}
