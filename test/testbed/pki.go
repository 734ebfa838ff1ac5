package testbed

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
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

// PKI is a throwaway CA and the certificates a single-node cluster on
// 127.0.0.1 needs. Generated in process (ECDSA P-256): no openssl involved.
type PKI struct {
	Dir    string
	caCert *x509.Certificate
	caKey  crypto.Signer
}

type certSpec struct {
	name  string
	cn    string
	org   []string
	dns   []string
	ips   []net.IP
	usage []x509.ExtKeyUsage
}

// NewPKI writes ca.{crt,key} and the component certificates into dir.
func NewPKI(dir, nodeName string) (*PKI, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "coordino-testbed-ca"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, err
	}
	ca, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	p := &PKI{Dir: dir, caCert: ca, caKey: key}
	if err := p.write("ca", der, key); err != nil {
		return nil, err
	}
	local := []net.IP{net.ParseIP("127.0.0.1")}
	server, client := []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	specs := []certSpec{
		{name: "apiserver", cn: "kube-apiserver", usage: server,
			dns: []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"},
			ips: append(local, net.ParseIP("10.96.0.1"))},
		{name: "admin", cn: "admin", org: []string{"system:masters"}, usage: client},
		{name: "apiserver-kubelet-client", cn: "kube-apiserver-kubelet-client", org: []string{"system:masters"}, usage: client},
		{name: "kubelet-client", cn: "system:node:" + nodeName, org: []string{"system:nodes"}, usage: client},
		{name: "kubelet-serving", cn: nodeName, dns: []string{"localhost", nodeName}, ips: local, usage: server},
	}
	for i, s := range specs {
		if err := p.issue(int64(i+2), s); err != nil {
			return nil, err
		}
	}
	// Service account token signing key.
	sa, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	if err := writeKey(p.path("sa.key"), sa); err != nil {
		return nil, err
	}
	pub, err := x509.MarshalPKIXPublicKey(sa.Public())
	if err != nil {
		return nil, err
	}
	return p, os.WriteFile(p.path("sa.pub"), pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}), 0o600)
}

func (p *PKI) path(name string) string { return filepath.Join(p.Dir, name) }

// Cert and Key return the paths of a named certificate and its key.
func (p *PKI) Cert(name string) string { return p.path(name + ".crt") }
func (p *PKI) Key(name string) string  { return p.path(name + ".key") }

// Issue writes name.crt and name.key: a certificate for cn (organizations
// org, DNS and IP SANs) signed by the CA, for server or client use.
func (p *PKI) Issue(name, cn string, org, dns []string, ips []net.IP, server bool) error {
	usage := []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	if server {
		usage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return err
	}
	return p.issue(serial.Int64()+1000, certSpec{name: name, cn: cn, org: org, dns: dns, ips: ips, usage: usage})
}

func (p *PKI) issue(serial int64, s certSpec) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial),
		Subject:      pkix.Name{CommonName: s.cn, Organization: s.org},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:  s.usage,
		DNSNames:     s.dns,
		IPAddresses:  s.ips,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.caCert, key.Public(), p.caKey)
	if err != nil {
		return fmt.Errorf("issue %s: %w", s.name, err)
	}
	return p.write(s.name, der, key)
}

func (p *PKI) write(name string, der []byte, key *ecdsa.PrivateKey) error {
	if err := os.WriteFile(p.Cert(name), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		return err
	}
	return writeKey(p.Key(name), key)
}

func writeKey(path string, key *ecdsa.PrivateKey) error {
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), 0o600)
}

// Kubeconfig writes a kubeconfig for a client certificate and returns its path.
func (p *PKI) Kubeconfig(name, server string) (string, error) {
	cfg := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- cluster: {certificate-authority: %q, server: %q}
  name: testbed
users:
- name: %s
  user: {client-certificate: %q, client-key: %q}
contexts:
- context: {cluster: testbed, user: %s}
  name: testbed
current-context: testbed
`, p.Cert("ca"), server, name, p.Cert(name), p.Key(name), name)
	path := p.path(name + ".kubeconfig")
	return path, os.WriteFile(path, []byte(cfg), 0o600)
}
