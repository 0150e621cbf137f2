package proxy

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// The environment interop/run.sh sets:
//
//	INTEROP_UPSTREAM_KUBECONFIG  the upstream kube-apiserver's admin kubeconfig (system:masters)
//	INTEROP_UPSTREAM_PKI         its PKI folder (ca.crt, ca.key): user certificates are minted here
//	INTEROP_PROXY_URL            the proxy's https URL
//	INTEROP_PROXY_CA             the CA of the proxy's serving certificate (PEM file)
//	INTEROP_UPSTREAM_DIR         the folder kube.sh started the upstream in (the restart tests)
//	INTEROP_PROXY_DIR            the folder gateway.sh start-proxy started the proxy in (the
//	                             proxy's restart test, which runs gateway.sh stop/start-proxy)
//
// Without them every test is skipped, so `go test ./...` and `go vet ./...` work anywhere.
type env struct {
	upstreamKubeconfig string
	pki                string
	proxyURL           string
	proxyCA            []byte
	// The admin kubeconfig, as is and with only its server and CA changed to the proxy's.
	upstream *rest.Config
	proxy    *rest.Config
}

var (
	envOnce sync.Once
	theEnv  *env
	envErr  error
)

func getEnv(t *testing.T) *env {
	t.Helper()
	if os.Getenv("INTEROP_UPSTREAM_KUBECONFIG") == "" {
		t.Skip("INTEROP_UPSTREAM_KUBECONFIG is not set (interop/run.sh sets it)")
	}
	envOnce.Do(func() {
		e := &env{
			upstreamKubeconfig: os.Getenv("INTEROP_UPSTREAM_KUBECONFIG"),
			pki:                os.Getenv("INTEROP_UPSTREAM_PKI"),
			proxyURL:           os.Getenv("INTEROP_PROXY_URL"),
		}
		e.proxyCA, envErr = os.ReadFile(os.Getenv("INTEROP_PROXY_CA"))
		if envErr != nil {
			return
		}
		e.upstream, envErr = clientcmd.BuildConfigFromFlags("", e.upstreamKubeconfig)
		if envErr != nil {
			return
		}
		e.upstream.Timeout = 30 * time.Second
		e.proxy = e.throughProxy(e.upstream)
		theEnv = e
	})
	if envErr != nil {
		t.Fatalf("interop environment: %v", envErr)
	}
	return theEnv
}

// throughProxy is cfg with only its server and CA changed to the proxy's: what a user does to
// their kubeconfig to go through the proxy.
func (e *env) throughProxy(cfg *rest.Config) *rest.Config {
	c := rest.CopyConfig(cfg)
	c.Host = e.proxyURL
	c.TLSClientConfig.CAData = e.proxyCA
	c.TLSClientConfig.CAFile = ""
	return c
}

func (e *env) clients(t *testing.T, cfg *rest.Config) kubernetes.Interface {
	t.Helper()
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// userConfig is the upstream's config for a user with a client certificate minted from the
// cluster CA (CN the user, O the groups), and no other credential.
func (e *env) userConfig(t *testing.T, user string, groups ...string) *rest.Config {
	t.Helper()
	certPEM, keyPEM, err := mintClientCert(filepath.Join(e.pki, "ca.crt"), filepath.Join(e.pki, "ca.key"), user, groups)
	if err != nil {
		t.Fatalf("minting a certificate for %s: %v", user, err)
	}
	c := &rest.Config{
		Host:    e.upstream.Host,
		Timeout: 30 * time.Second,
		TLSClientConfig: rest.TLSClientConfig{
			CAData:   e.upstream.TLSClientConfig.CAData,
			CAFile:   e.upstream.TLSClientConfig.CAFile,
			CertData: certPEM,
			KeyData:  keyPEM,
		},
	}
	return c
}

// writeKubeconfig writes cfg (a client certificate or a token) as a kubeconfig file for kubectl.
func writeKubeconfig(t *testing.T, cfg *rest.Config) string {
	t.Helper()
	ca := cfg.TLSClientConfig.CAData
	if len(ca) == 0 && cfg.TLSClientConfig.CAFile != "" {
		var err error
		if ca, err = os.ReadFile(cfg.TLSClientConfig.CAFile); err != nil {
			t.Fatal(err)
		}
	}
	cert, key := cfg.TLSClientConfig.CertData, cfg.TLSClientConfig.KeyData
	if len(cert) == 0 && cfg.TLSClientConfig.CertFile != "" {
		var err error
		if cert, err = os.ReadFile(cfg.TLSClientConfig.CertFile); err != nil {
			t.Fatal(err)
		}
		if key, err = os.ReadFile(cfg.TLSClientConfig.KeyFile); err != nil {
			t.Fatal(err)
		}
	}
	kc := clientcmdapi.NewConfig()
	kc.Clusters["c"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: ca}
	kc.AuthInfos["u"] = &clientcmdapi.AuthInfo{ClientCertificateData: cert, ClientKeyData: key, Token: cfg.BearerToken}
	kc.Contexts["x"] = &clientcmdapi.Context{Cluster: "c", AuthInfo: "u"}
	kc.CurrentContext = "x"
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// mintClientCert issues a client certificate (ECDSA P-256, one hour) from the CA files.
func mintClientCert(caCertPath, caKeyPath, cn string, orgs []string) (certPEM, keyPEM []byte, err error) {
	return mintClientCertSubject(caCertPath, caKeyPath, pkix.Name{CommonName: cn, Organization: orgs})
}

// mintClientCertSubject is mintClientCert with the whole subject given: with only ExtraNames
// set, each of them is one attribute of its own, in their order (several CNs, a UID).
func mintClientCertSubject(caCertPath, caKeyPath string, subject pkix.Name) (certPEM, keyPEM []byte, err error) {
	caCertBytes, err := os.ReadFile(caCertPath)
	if err != nil {
		return nil, nil, err
	}
	caKeyBytes, err := os.ReadFile(caKeyPath)
	if err != nil {
		return nil, nil, err
	}
	block, _ := pem.Decode(caCertBytes)
	if block == nil {
		return nil, nil, fmt.Errorf("%s: no PEM", caCertPath)
	}
	caCert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return nil, nil, err
	}
	kblock, _ := pem.Decode(caKeyBytes)
	if kblock == nil {
		return nil, nil, fmt.Errorf("%s: no PEM", caKeyPath)
	}
	var caKey any
	if caKey, err = x509.ParsePKCS8PrivateKey(kblock.Bytes); err != nil {
		var rsaKey *rsa.PrivateKey
		if rsaKey, err = x509.ParsePKCS1PrivateKey(kblock.Bytes); err != nil {
			return nil, nil, fmt.Errorf("%s: %v", caKeyPath, err)
		}
		caKey = rsaKey
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	serial, err := rand.Int(rand.Reader, big.NewInt(1<<62))
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      subject,
		NotBefore:    time.Now().Add(-5 * time.Minute),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
	if err != nil {
		return nil, nil, err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), nil
}
