package proxy

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// The proxy is never more permissive than its upstream: every request here is sent with the
// same credential twice, straight to kube-apiserver and through the proxy, over HTTP/2 and
// over HTTP/1.1, and the two status codes are compared. A 2xx (or 101) through the proxy where
// the upstream answers 4xx fails a row; so does a 401, 403 or 429 through the proxy where the
// upstream answers 2xx. A row with an expected proxy answer is a documented difference, its
// reason beside it.

const (
	permA    = "perm-a"
	permB    = "perm-b"
	permNode = "perm-node-1"
	permPod  = "perm-pod"
)

// permCred is one caller's credential: a client certificate, a bearer token, or neither.
type permCred struct {
	name  string
	cert  *tls.Certificate
	der   []byte // the certificate, for its credential id
	token string
}

// permCertCred mints a certificate with the subject given from the upstream's CA.
func permCertCred(t *testing.T, e *env, name string, subject pkix.Name) *permCred {
	t.Helper()
	certPEM, keyPEM, err := mintClientCertSubject(filepath.Join(e.pki, "ca.crt"), filepath.Join(e.pki, "ca.key"), subject)
	if err != nil {
		t.Fatalf("minting a certificate for %s: %v", name, err)
	}
	return permPEMCred(t, name, certPEM, keyPEM)
}

func permPEMCred(t *testing.T, name string, certPEM, keyPEM []byte) *permCred {
	t.Helper()
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return &permCred{name: name, cert: &cert, der: cert.Certificate[0]}
}

func permUser(t *testing.T, e *env, cn string, orgs ...string) *permCred {
	return permCertCred(t, e, cn, pkix.Name{CommonName: cn, Organization: orgs})
}

// permAdmin is the upstream's admin (CN=admin, O=system:masters), the proxy's own identity.
func permAdmin(t *testing.T, e *env) *permCred {
	t.Helper()
	tc := e.upstream.TLSClientConfig
	certPEM, keyPEM := tc.CertData, tc.KeyData
	var err error
	if len(certPEM) == 0 {
		if certPEM, err = os.ReadFile(tc.CertFile); err != nil {
			t.Fatal(err)
		}
	}
	if len(keyPEM) == 0 {
		if keyPEM, err = os.ReadFile(tc.KeyFile); err != nil {
			t.Fatal(err)
		}
	}
	return permPEMCred(t, "admin", certPEM, keyPEM)
}

var (
	oidCN  = asn1.ObjectIdentifier{2, 5, 4, 3}
	oidUID = asn1.ObjectIdentifier{1, 3, 6, 1, 4, 1, 57683, 2}
)

// permCNs is a subject of several CN attributes, in order.
func permCNs(cns ...string) pkix.Name {
	var n pkix.Name
	for _, cn := range cns {
		n.ExtraNames = append(n.ExtraNames, pkix.AttributeTypeAndValue{Type: oidCN, Value: cn})
	}
	return n
}

// permUTF8 is an attribute value encoded as a UTF8String (Go would pick PrintableString).
func permUTF8(s string) asn1.RawValue {
	return asn1.RawValue{Class: asn1.ClassUniversal, Tag: asn1.TagUTF8String, Bytes: []byte(s)}
}

// permClients holds one transport per credential, target and protocol.
type permClients struct {
	e           *env
	upstreamCAs *x509.CertPool
	proxyCAs    *x509.CertPool
	mu          sync.Mutex
	transports  map[permTransportKey]*http.Transport
}

type permTransportKey struct {
	cred  *permCred
	proxy bool
	h1    bool
}

func newPermClients(t *testing.T, e *env) *permClients {
	t.Helper()
	ca := e.upstream.TLSClientConfig.CAData
	if len(ca) == 0 {
		var err error
		if ca, err = os.ReadFile(e.upstream.TLSClientConfig.CAFile); err != nil {
			t.Fatal(err)
		}
	}
	p := &permClients{e: e, upstreamCAs: x509.NewCertPool(), proxyCAs: x509.NewCertPool(), transports: map[permTransportKey]*http.Transport{}}
	if !p.upstreamCAs.AppendCertsFromPEM(ca) || !p.proxyCAs.AppendCertsFromPEM(e.proxyCA) {
		t.Fatal("no CA certificate in the upstream's or the proxy's CA file")
	}
	t.Cleanup(p.close)
	return p
}

func (p *permClients) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, tr := range p.transports {
		tr.CloseIdleConnections()
	}
}

// transport is HTTP/2 (h1 false) or HTTP/1.1 only (ALPN without h2: no TLSNextProto).
func (p *permClients) transport(c *permCred, proxy, h1 bool) *http.Transport {
	p.mu.Lock()
	defer p.mu.Unlock()
	key := permTransportKey{c, proxy, h1}
	if tr := p.transports[key]; tr != nil {
		return tr
	}
	tc := &tls.Config{RootCAs: p.upstreamCAs}
	if proxy {
		tc.RootCAs = p.proxyCAs
	}
	if c.cert != nil {
		tc.Certificates = []tls.Certificate{*c.cert}
	}
	tr := &http.Transport{
		TLSClientConfig:     tc,
		ForceAttemptHTTP2:   !h1,
		MaxIdleConnsPerHost: 200,
		IdleConnTimeout:     30 * time.Second,
		TLSHandshakeTimeout: 10 * time.Second,
	}
	if h1 {
		tr.TLSNextProto = map[string]func(string, *tls.Conn) http.RoundTripper{}
	}
	p.transports[key] = tr
	return tr
}

func (p *permClients) base(proxy bool) string {
	if proxy {
		return p.e.proxyURL
	}
	return p.e.upstream.Host
}

// permReq is one raw request: the path is sent as written (percent-encoding, dot segments,
// doubled slashes and repeated query parameters included).
type permReq struct {
	method string
	path   string
	header http.Header
	body   string
	stream bool // a watch or an upgrade: read its first bytes, then close
}

func permGet(path string, kv ...string) permReq {
	return permReq{method: http.MethodGet, path: path, header: permHeader(kv...)}
}

func permWatch(path string, kv ...string) permReq {
	r := permGet(path, kv...)
	r.stream = true
	return r
}

const permSSRBody = `{"apiVersion":"authentication.k8s.io/v1","kind":"SelfSubjectReview"}`

func permSSR(kv ...string) permReq {
	h := permHeader(kv...)
	h.Set("Content-Type", "application/json")
	return permReq{method: http.MethodPost, path: "/apis/authentication.k8s.io/v1/selfsubjectreviews", header: h, body: permSSRBody}
}

// permHeader is a header from name, value pairs; a name given twice has both values, in order.
func permHeader(kv ...string) http.Header {
	h := http.Header{}
	for i := 0; i+1 < len(kv); i += 2 {
		h[http.CanonicalHeaderKey(kv[i])] = append(h[http.CanonicalHeaderKey(kv[i])], kv[i+1])
	}
	return h
}

// upgrade is a request the HTTP/1.1 way only (Connection and Upgrade are not h2 headers).
func (r permReq) upgrade() bool {
	return r.header.Get("Upgrade") != "" || r.header.Get("Connection") != ""
}

func withWebSocket(r permReq) permReq {
	h := r.header.Clone()
	h.Set("Connection", "Upgrade")
	h.Set("Upgrade", "websocket")
	h.Set("Sec-WebSocket-Version", "13")
	h.Set("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==")
	h.Set("Sec-WebSocket-Protocol", "v5.channel.k8s.io, v4.channel.k8s.io")
	r.header, r.stream = h, true
	return r
}

func withSPDY(r permReq) permReq {
	h := r.header.Clone()
	h.Set("Connection", "Upgrade")
	h.Set("Upgrade", "SPDY/3.1")
	h.Set("X-Stream-Protocol-Version", "v4.channel.k8s.io")
	r.header, r.stream = h, true
	return r
}

type permAnswer struct {
	code   int
	proto  string
	header http.Header
	body   []byte
	err    error
}

func (a permAnswer) String() string {
	if a.err != nil {
		return "error: " + a.err.Error()
	}
	return fmt.Sprint(a.code)
}

// do sends r and reads its answer: all of it, or for a stream what came within 300 ms.
func (p *permClients) do(parent context.Context, c *permCred, proxy, h1 bool, r permReq) permAnswer {
	u, err := url.Parse(p.base(proxy))
	if err != nil {
		return permAnswer{err: err}
	}
	rawPath, query, _ := strings.Cut(r.path, "?")
	u.RawQuery = query
	if u.Path, err = url.PathUnescape(rawPath); err != nil {
		return permAnswer{err: err}
	}
	u.RawPath = rawPath
	c2, cancel := context.WithTimeout(parent, 15*time.Second)
	defer cancel()
	var body io.Reader
	if r.body != "" {
		body = strings.NewReader(r.body)
	}
	req, err := http.NewRequestWithContext(c2, r.method, u.String(), body)
	if err != nil {
		return permAnswer{err: err}
	}
	req.URL = u
	for k, v := range r.header {
		req.Header[k] = append([]string(nil), v...)
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := (&http.Client{Transport: p.transport(c, proxy, h1)}).Do(req)
	if err != nil {
		return permAnswer{err: err}
	}
	a := permAnswer{code: resp.StatusCode, proto: resp.Proto, header: resp.Header}
	done := make(chan []byte, 1)
	go func() {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
		done <- b
	}()
	wait := 10 * time.Second
	if r.stream || resp.StatusCode == http.StatusSwitchingProtocols {
		wait = 300 * time.Millisecond
	}
	select {
	case a.body = <-done:
	case <-time.After(wait):
		cancel()
		_ = resp.Body.Close()
		a.body = <-done
	}
	_ = resp.Body.Close()
	return a
}

// permRow is one request of the table.
type permRow struct {
	name string
	who  *permCred
	req  permReq
	// What kube-apiserver answers, checked so that the row tests what it says (0: not checked).
	wantDirect int
	// A documented difference: what the proxy answers instead of following the rules (0: the rules).
	wantProxy int
	why       string
	// Both answers 200: the same items, by name (a list in JSON).
	sameItems bool
}

type permResult struct {
	row          *permRow
	proto        string
	direct, prox permAnswer
	verdict      string
}

func allowed(code int) bool { return code/100 == 2 || code == http.StatusSwitchingProtocols }

func refused(code int) bool {
	return code == http.StatusUnauthorized || code == http.StatusForbidden || code == http.StatusTooManyRequests
}

// judge is the verdict on one row over one protocol: "" when it passes.
func judge(r *permRow, d, p permAnswer) string {
	var why []string
	if d.err != nil {
		why = append(why, "no answer from the upstream: "+d.err.Error())
	} else if r.wantDirect != 0 && d.code != r.wantDirect {
		why = append(why, fmt.Sprintf("the upstream answers %d, the row assumes %d", d.code, r.wantDirect))
	}
	switch {
	case p.err != nil:
		why = append(why, "no answer from the proxy: "+p.err.Error())
	case r.wantProxy != 0:
		if p.code != r.wantProxy {
			why = append(why, fmt.Sprintf("documented proxy answer %d, got %d", r.wantProxy, p.code))
		}
	case d.err != nil:
	case allowed(p.code) && d.code/100 == 4:
		why = append(why, "MORE PERMISSIVE than the upstream")
	case refused(p.code) && allowed(d.code):
		why = append(why, "less permissive than the upstream")
	}
	if r.sameItems && d.err == nil && p.err == nil && d.code == 200 && p.code == 200 {
		dn, derr := itemNamesOf(d.body)
		pn, perr := itemNamesOf(p.body)
		if derr != nil || perr != nil || !reflect.DeepEqual(dn, pn) {
			why = append(why, fmt.Sprintf("items differ: upstream %v (%v), proxy %v (%v)", dn, derr, pn, perr))
		}
	}
	return strings.Join(why, "; ")
}

func itemNamesOf(body []byte) ([]string, error) {
	var list struct {
		Items []struct {
			Metadata struct {
				Name string `json:"name"`
			} `json:"metadata"`
		} `json:"items"`
	}
	if err := json.Unmarshal(body, &list); err != nil {
		return nil, err
	}
	names := []string{}
	for _, it := range list.Items {
		names = append(names, it.Metadata.Name)
	}
	sort.Strings(names)
	return names, nil
}

// runPermRows sends every row over h2 and HTTP/1.1 (upgrades over HTTP/1.1 only), upstream
// and proxy at once, and fails the rows that break the rules. Every row is logged.
func runPermRows(t *testing.T, pc *permClients, rows []*permRow, budget time.Duration) {
	t.Helper()
	deadline := time.Now().Add(budget)
	var results []permResult
	for _, r := range rows {
		if time.Now().After(deadline) {
			t.Errorf("out of time (%s) before row %q: the remaining rows were not sent", budget, r.name)
			break
		}
		protos := []bool{false, true}
		if r.req.upgrade() {
			protos = []bool{true}
		}
		for _, h1 := range protos {
			var d, p permAnswer
			var wg sync.WaitGroup
			wg.Add(2)
			go func() { defer wg.Done(); d = pc.do(context.Background(), r.who, false, h1, r.req) }()
			go func() { defer wg.Done(); p = pc.do(context.Background(), r.who, true, h1, r.req) }()
			wg.Wait()
			proto := "h2"
			if h1 {
				proto = "http/1.1"
			}
			res := permResult{row: r, proto: proto, direct: d, prox: p, verdict: judge(r, d, p)}
			if !h1 && d.err == nil && p.err == nil && (d.proto != "HTTP/2.0" || p.proto != "HTTP/2.0") {
				res.verdict = strings.TrimPrefix(res.verdict+"; not HTTP/2: upstream "+d.proto+", proxy "+p.proto, "; ")
			}
			results = append(results, res)
		}
	}
	var table strings.Builder
	failed := 0
	for _, res := range results {
		mark, why := "ok", ""
		if res.verdict != "" {
			mark = "FAIL"
			failed++
		} else if res.row.wantProxy != 0 {
			mark = "documented"
		}
		if res.row.wantProxy != 0 {
			why = fmt.Sprintf(" (proxy %d: %s)", res.row.wantProxy, res.row.why)
		}
		fmt.Fprintf(&table, "%-8s direct %-5s proxy %-5s %-10s %s: %s%s\n", res.proto, res.direct, res.prox, mark, res.row.who.name, res.row.name, why)
	}
	t.Logf("%d requests, %d failed:\n%s", len(results), failed, table.String())
	for _, res := range results {
		if res.verdict == "" {
			continue
		}
		t.Errorf("%s [%s, %s, %s %s]: %s\n  upstream %s: %.300s\n  proxy    %s: %.300s", res.row.name, res.row.who.name, res.proto,
			res.row.req.method, res.row.req.path, res.verdict,
			res.direct, bytes.TrimSpace(res.direct.body), res.prox, bytes.TrimSpace(res.prox.body))
	}
}

// setUpPerm makes (or finds) what these tests read: namespaces perm-a and perm-b (kept: no
// controller-manager finalizes a deleted namespace), their ConfigMaps and a Secret, a Node and
// a Pod bound to it, and the RBAC of the perm-* users. Idempotent.
func setUpPerm(t *testing.T, e *env) {
	t.Helper()
	kube := e.clients(t, e.upstream)
	c := ctx(t)
	must := func(what string, err error) {
		t.Helper()
		if err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatalf("%s: %v", what, err)
		}
	}
	for _, ns := range []string{permA, permB} {
		_, err := kube.CoreV1().Namespaces().Create(c, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
		must("namespace "+ns, err)
		_, err = kube.CoreV1().ServiceAccounts(ns).Create(c, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{})
		must("serviceaccount default", err)
		for _, name := range []string{"perm-cm1", "perm-cm2"} {
			_, err = kube.CoreV1().ConfigMaps(ns).Create(c, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}, Data: map[string]string{"k": ns + "/" + name}}, metav1.CreateOptions{})
			must("configmap "+name, err)
		}
		_, err = kube.CoreV1().Secrets(ns).Create(c, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "perm-secret"}, StringData: map[string]string{"password": "hunter2"}}, metav1.CreateOptions{})
		must("secret", err)
	}
	rw := []string{"get", "list", "watch"}
	core := func(verbs []string, resources ...string) rbacv1.PolicyRule {
		return rbacv1.PolicyRule{APIGroups: []string{""}, Resources: resources, Verbs: verbs}
	}
	user := func(name string) rbacv1.Subject {
		return rbacv1.Subject{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: name}
	}
	sa := func(name string) rbacv1.Subject {
		return rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Name: name, Namespace: permA}
	}
	permRole(t, kube, permA, "perm-reader", []rbacv1.PolicyRule{core(rw, "configmaps", "pods")}, user("perm-reader"))
	// Readers of perm-a's ConfigMaps only: perm-erin (whom perm-imp-one may be), perm-other
	// (TestLongRunningIsolation) and the ServiceAccounts of the token tests.
	permRole(t, kube, permA, "perm-cm-reader", []rbacv1.PolicyRule{core(rw, "configmaps")},
		user("perm-erin"), user("perm-other"), sa("perm-iso"), sa("perm-revoke"), sa("perm-ssr"))
	permRole(t, kube, permA, "perm-sa-imp", []rbacv1.PolicyRule{core([]string{"impersonate"}, "serviceaccounts")}, user("perm-sa-imp"))
	permClusterRole(t, kube, "perm-imp-one", []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"users"}, Verbs: []string{"impersonate"}, ResourceNames: []string{"perm-erin"}}}, user("perm-imp-one"))

	// A Node and a Pod on it that mounts perm-cm1: the Node authorizer lets the node read it.
	_, err := kube.CoreV1().Nodes().Create(c, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: permNode}}, metav1.CreateOptions{})
	must("node", err)
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: permPod},
		Spec: corev1.PodSpec{
			NodeName:                     permNode,
			AutomountServiceAccountToken: ptr(false),
			Containers: []corev1.Container{{
				Name: "c", Image: "registry.k8s.io/pause:3.10",
				VolumeMounts: []corev1.VolumeMount{{Name: "cm", MountPath: "/cm"}},
			}},
			Volumes: []corev1.Volume{{Name: "cm", VolumeSource: corev1.VolumeSource{
				ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "perm-cm1"}},
			}}},
		},
	}
	_, err = kube.CoreV1().Pods(permA).Create(c, pod, metav1.CreateOptions{})
	must("pod", err)
}

func permRole(t *testing.T, kube kubernetes.Interface, ns, name string, rules []rbacv1.PolicyRule, subjects ...rbacv1.Subject) {
	t.Helper()
	c := ctx(t)
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: rules}
	if _, err := kube.RbacV1().Roles(ns).Create(c, role, metav1.CreateOptions{}); apierrors.IsAlreadyExists(err) {
		_, err = kube.RbacV1().Roles(ns).Update(c, role, metav1.UpdateOptions{})
		if err != nil {
			t.Fatal(err)
		}
	} else if err != nil {
		t.Fatal(err)
	}
	b := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: name},
		Subjects:   subjects,
	}
	if _, err := kube.RbacV1().RoleBindings(ns).Create(c, b, metav1.CreateOptions{}); apierrors.IsAlreadyExists(err) {
		_, err = kube.RbacV1().RoleBindings(ns).Update(c, b, metav1.UpdateOptions{})
		if err != nil {
			t.Fatal(err)
		}
	} else if err != nil {
		t.Fatal(err)
	}
}

func permClusterRole(t *testing.T, kube kubernetes.Interface, name string, rules []rbacv1.PolicyRule, subjects ...rbacv1.Subject) {
	t.Helper()
	c := ctx(t)
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: rules}
	if _, err := kube.RbacV1().ClusterRoles().Create(c, role, metav1.CreateOptions{}); apierrors.IsAlreadyExists(err) {
		_, err = kube.RbacV1().ClusterRoles().Update(c, role, metav1.UpdateOptions{})
		if err != nil {
			t.Fatal(err)
		}
	} else if err != nil {
		t.Fatal(err)
	}
	b := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name},
		Subjects:   subjects,
	}
	if _, err := kube.RbacV1().ClusterRoleBindings().Create(c, b, metav1.CreateOptions{}); apierrors.IsAlreadyExists(err) {
		_, err = kube.RbacV1().ClusterRoleBindings().Update(c, b, metav1.UpdateOptions{})
		if err != nil {
			t.Fatal(err)
		}
	} else if err != nil {
		t.Fatal(err)
	}
}

// permWaitFor polls a request upstream until it answers want: the authorizers (RBAC's and the
// Node graph) read what setUpPerm wrote through informers.
func permWaitFor(t *testing.T, pc *permClients, c *permCred, proxy bool, r permReq, want int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		a := pc.do(context.Background(), c, proxy, false, r)
		if a.err == nil && a.code == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s %s as %s (proxy %v): want %d, still %s: %.300s", r.method, r.path, c.name, proxy, want, a, a.body)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func TestPermissionDifferential(t *testing.T) {
	e := getEnv(t)
	setUpPerm(t, e)
	pc := newPermClients(t, e)

	reader := permUser(t, e, "perm-reader", "perm-team")
	node := permUser(t, e, "system:node:"+permNode, "system:nodes")
	impOne := permUser(t, e, "perm-imp-one")
	saImp := permUser(t, e, "perm-sa-imp")
	admin := permAdmin(t, e)
	anonymous := &permCred{name: "anonymous"}

	const (
		cmA  = "/api/v1/namespaces/perm-a/configmaps"
		cmB  = "/api/v1/namespaces/perm-b/configmaps"
		secA = "/api/v1/namespaces/perm-a/secrets"
		rv0  = "resourceVersion=0"
		ssr  = "/apis/authentication.k8s.io/v1/selfsubjectreviews"
	)
	permWaitFor(t, pc, reader, false, permGet(cmA), 200)
	permWaitFor(t, pc, node, false, permGet(cmA+"/perm-cm1"), 200)
	permWaitFor(t, pc, impOne, false, permGet(cmA, "Impersonate-User", "perm-erin"), 200)
	permWaitFor(t, pc, saImp, false, permSSR("Impersonate-User", "system:serviceaccount:perm-a:default"), 201)
	// The proxy's cache has perm-a's ConfigMaps (the rows compare the items of cached lists).
	permWaitFor(t, pc, admin, true, permGet(cmA+"?fieldSelector=metadata.name%3Dperm-cm2&"+rv0), 200)

	var rows []*permRow
	add := func(who *permCred, name string, req permReq, wantDirect int) *permRow {
		rows = append(rows, &permRow{name: name, who: who, req: req, wantDirect: wantDirect})
		return rows[len(rows)-1]
	}
	items := func(r *permRow) { r.sameItems = true }

	// perm-reader: configmaps and pods in perm-a, nothing else.
	items(add(reader, "list configmaps perm-a", permGet(cmA), 200))
	items(add(reader, "list configmaps perm-a rv=0 (cached)", permGet(cmA+"?"+rv0), 200))
	add(reader, "get configmap perm-a", permGet(cmA+"/perm-cm1"), 200)
	add(reader, "get configmap perm-a rv=0", permGet(cmA+"/perm-cm1?"+rv0), 200)
	add(reader, "watch configmaps perm-a (passed through)", permWatch(cmA+"?watch=1"), 200)
	add(reader, "watch configmaps perm-a rv=0 (cached)", permWatch(cmA+"?watch=1&"+rv0), 200)
	items(add(reader, "list pods perm-a rv=0", permGet("/api/v1/namespaces/perm-a/pods?"+rv0), 200))
	add(reader, "list configmaps perm-b", permGet(cmB), 403)
	add(reader, "list configmaps perm-b rv=0", permGet(cmB+"?"+rv0), 403)
	add(reader, "get configmap perm-b", permGet(cmB+"/perm-cm1"), 403)
	add(reader, "watch configmaps perm-b", permWatch(cmB+"?watch=1"), 403)
	add(reader, "watch configmaps perm-b rv=0", permWatch(cmB+"?watch=1&"+rv0), 403)
	add(reader, "list secrets perm-a", permGet(secA), 403)
	add(reader, "list secrets perm-a rv=0", permGet(secA+"?"+rv0), 403)
	add(reader, "get secret perm-a", permGet(secA+"/perm-secret"), 403)
	add(reader, "watch secrets perm-a", permWatch(secA+"?watch=1"), 403)
	add(reader, "watch secrets perm-a rv=0", permWatch(secA+"?watch=1&"+rv0), 403)
	add(reader, "list configmaps cluster-wide", permGet("/api/v1/configmaps"), 403)
	add(reader, "list configmaps cluster-wide rv=0", permGet("/api/v1/configmaps?"+rv0), 403)
	add(reader, "watch configmaps cluster-wide rv=0", permWatch("/api/v1/configmaps?watch=1&"+rv0), 403)
	add(reader, "get /readyz/upstream", permGet("/readyz/upstream"), 403)

	// Paths the proxy might read otherwise than the upstream does.
	for _, q := range []string{"", "?" + rv0} {
		add(reader, "dot segments perm-a/../perm-b"+q, permGet("/api/v1/namespaces/perm-a/../perm-b/configmaps"+q), 0)
		add(reader, "dot segments perm-b/../perm-a"+q, permGet("/api/v1/namespaces/perm-b/../perm-a/configmaps"+q), 0)
		add(reader, "encoded dot segments perm-a%2F..%2Fperm-b"+q, permGet("/api/v1/namespaces/perm-a%2F..%2Fperm-b/configmaps"+q), 0)
		add(reader, "double slash perm-b"+q, permGet("//api/v1/namespaces/perm-b/configmaps"+q), 0)
		add(reader, "double slash perm-a"+q, permGet("//api/v1/namespaces/perm-a/configmaps"+q), 0)
		add(reader, "inner double slash perm-b"+q, permGet("/api/v1//namespaces/perm-b/configmaps"+q), 0)
		add(reader, "encoded perm%2Db"+q, permGet("/api/v1/namespaces/perm%2Db/configmaps"+q), 403)
		add(reader, "encoded perm%2Da"+q, permGet("/api/v1/namespaces/perm%2Da/configmaps"+q), 200)
		add(reader, "encoded %73ecrets perm-a"+q, permGet("/api/v1/namespaces/perm-a/%73ecrets"+q), 403)
		add(reader, "trailing slash perm-b"+q, permGet(cmB+"/"+q), 0)
		add(reader, "trailing slash perm-a"+q, permGet(cmA+"/"+q), 0)
		add(reader, "trailing slash secrets perm-a"+q, permGet(secA+"/"+q), 0)
	}

	// Repeated query parameters: kube-apiserver reads the first.
	fs := func(name string) string { return "fieldSelector=metadata.name%3D" + name }
	for _, q := range []string{"", "&" + rv0} {
		items(add(reader, "two fieldSelectors perm-a"+q, permGet(cmA+"?"+fs("perm-cm1")+"&"+fs("perm-cm2")+q), 200))
		add(reader, "two fieldSelectors perm-b"+q, permGet(cmB+"?"+fs("perm-cm1")+"&"+fs("perm-cm2")+q), 403)
		items(add(reader, "watch=0&watch=1 perm-a"+q, permWatch(cmA+"?watch=0&watch=1"+q), 200))
		add(reader, "watch=0&watch=1 perm-b"+q, permWatch(cmB+"?watch=0&watch=1"+q), 403)
		add(reader, "watch=1&watch=0 secrets"+q, permWatch(secA+"?watch=1&watch=0"+q), 403)
	}
	items(add(reader, "resourceVersion twice perm-a", permGet(cmA+"?resourceVersion=&"+rv0), 200))
	add(reader, "resourceVersion twice perm-b", permGet(cmB+"?resourceVersion=&"+rv0), 403)
	add(reader, "resourceVersion twice perm-b (0 first)", permGet(cmB+"?"+rv0+"&resourceVersion="), 403)

	// Media types, cached (rv=0) and passed through.
	for _, mt := range []string{
		"application/json",
		"application/vnd.kubernetes.protobuf",
		"application/yaml",
		"application/cbor",
		"application/json;as=Table;v=v1;g=meta.k8s.io",
	} {
		for _, q := range []string{"", "?" + rv0} {
			add(reader, "Accept "+mt+" configmaps perm-a"+q, permGet(cmA+q, "Accept", mt), 200)
			add(reader, "Accept "+mt+" configmaps perm-b"+q, permGet(cmB+q, "Accept", mt), 403)
			add(reader, "Accept "+mt+" secrets perm-a"+q, permGet(secA+q, "Accept", mt), 403)
		}
	}
	add(reader, "watch protobuf configmaps perm-a rv=0", permWatch(cmA+"?watch=1&"+rv0, "Accept", "application/vnd.kubernetes.protobuf;stream=watch"), 200)
	add(reader, "watch protobuf configmaps perm-b rv=0", permWatch(cmB+"?watch=1&"+rv0, "Accept", "application/vnd.kubernetes.protobuf;stream=watch"), 403)

	// HTTP/1.1 upgrades: a denied read stays denied with Connection: Upgrade.
	add(reader, "websocket get secret", withWebSocket(permGet(secA+"/perm-secret")), 403)
	add(reader, "websocket list secrets", withWebSocket(permGet(secA)), 403)
	add(reader, "websocket watch secrets", withWebSocket(permGet(secA+"?watch=1")), 403)
	add(reader, "websocket watch configmaps perm-b", withWebSocket(permGet(cmB+"?watch=1")), 403)
	add(reader, "websocket watch configmaps perm-b rv=0", withWebSocket(permGet(cmB+"?watch=1&"+rv0)), 403)
	add(reader, "SPDY get secret", withSPDY(permGet(secA+"/perm-secret")), 403)
	add(reader, "SPDY list secrets", withSPDY(permGet(secA)), 403)
	add(reader, "websocket exec", withWebSocket(permGet("/api/v1/namespaces/perm-a/pods/"+permPod+"/exec?command=true&stdout=1")), 403)
	add(reader, "SPDY exec", withSPDY(permReq{method: http.MethodPost, path: "/api/v1/namespaces/perm-a/pods/" + permPod + "/exec?command=true&stdout=1", header: http.Header{}}), 403)
	add(reader, "websocket attach", withWebSocket(permGet("/api/v1/namespaces/perm-a/pods/"+permPod+"/attach?stdout=1")), 403)
	add(reader, "websocket portforward", withWebSocket(permGet("/api/v1/namespaces/perm-a/pods/"+permPod+"/portforward?ports=80")), 403)
	add(reader, "logs follow", permWatch("/api/v1/namespaces/perm-a/pods/"+permPod+"/log?follow=true"), 403)

	// Hostile certificates from the upstream's CA.
	refusal := "documented refusal: the proxy refuses an identity it cannot pass upstream exactly"
	type hostile struct {
		subject string
		cred    *permCred
		refuse  bool // the proxy refuses this identity: 403 to every request
		reads   int  // what the upstream answers to reads of perm-a's ConfigMaps
	}
	for _, h := range []hostile{
		{`CN=perm-mallory O=" system:masters"`, permUser(t, e, "perm-mallory", " system:masters"), true, 403},
		{`CN=perm-mallory O="system:masters "`, permUser(t, e, "perm-mallory", "system:masters "), true, 403},
		{`CN=perm-mallory O="system:masters\t"`, permUser(t, e, "perm-mallory", "system:masters\t"), true, 403},
		{`CN=" perm-reader"`, permUser(t, e, " perm-reader"), true, 403},
		{`CN="perm-reader\t"`, permUser(t, e, "perm-reader\t"), true, 403},
		// kube-apiserver takes the last CN.
		{"CN=perm-reader CN=perm-nobody", permCertCred(t, e, "", permCNs("perm-reader", "perm-nobody")), false, 403},
		{"CN=perm-nobody CN=perm-reader", permCertCred(t, e, "", permCNs("perm-nobody", "perm-reader")), false, 200},
	} {
		subject := h.subject
		h.cred.name = "cert " + subject
		var hr []*permRow
		hr = append(hr,
			add(h.cred, "discovery /api", permGet("/api"), 200),
			add(h.cred, "list configmaps perm-a", permGet(cmA), h.reads),
			add(h.cred, "list configmaps perm-a rv=0", permGet(cmA+"?"+rv0), h.reads),
			add(h.cred, "get configmap perm-a", permGet(cmA+"/perm-cm1"), h.reads),
			add(h.cred, "list secrets perm-a", permGet(secA), 403),
			add(h.cred, "selfsubjectreview", permSSR(), 201),
			add(h.cred, "websocket get secret", withWebSocket(permGet(secA+"/perm-secret")), 403),
			add(h.cred, "websocket list secrets", withWebSocket(permGet(secA)), 403),
		)
		for _, r := range hr {
			if h.refuse {
				r.wantProxy, r.why = http.StatusForbidden, refusal
			}
		}
	}

	// Impersonation: kube-apiserver reads the first Impersonate-User header, and takes a name
	// that is not a valid ServiceAccount's for a user's.
	for _, q := range []string{"", "?" + rv0} {
		add(impOne, "impersonate perm-erin"+q, permGet(cmA+q, "Impersonate-User", "perm-erin"), 200)
		add(impOne, "impersonate admin"+q, permGet(cmA+q, "Impersonate-User", "admin"), 403)
		add(impOne, "impersonate admin, then perm-erin"+q, permGet(cmA+q, "Impersonate-User", "admin", "Impersonate-User", "perm-erin"), 403)
		add(impOne, "impersonate perm-erin, then admin"+q, permGet(cmA+q, "Impersonate-User", "perm-erin", "Impersonate-User", "admin"), 200)
		add(impOne, "impersonate perm-erin in system:masters"+q, permGet(cmA+q, "Impersonate-User", "perm-erin", "Impersonate-Group", "system:masters"), 403)
		add(impOne, "impersonate perm-erin, secrets"+q, permGet(secA+q, "Impersonate-User", "perm-erin"), 403)
	}
	add(impOne, "impersonate perm-erin, selfsubjectreview", permSSR("Impersonate-User", "perm-erin"), 201)
	add(impOne, "impersonate admin, then perm-erin, selfsubjectreview", permSSR("Impersonate-User", "admin", "Impersonate-User", "perm-erin"), 403)
	add(saImp, "impersonate system:serviceaccount:perm-a:default", permSSR("Impersonate-User", "system:serviceaccount:perm-a:default"), 201)
	add(saImp, "impersonate system:serviceaccount:perm-b:default", permSSR("Impersonate-User", "system:serviceaccount:perm-b:default"), 403)
	add(saImp, "impersonate system:serviceaccount:perm-a:NOT_VALID", permSSR("Impersonate-User", "system:serviceaccount:perm-a:NOT_VALID"), 403)
	add(saImp, "impersonate system:serviceaccount:perm-a:a:b", permSSR("Impersonate-User", "system:serviceaccount:perm-a:a:b"), 403)
	add(saImp, "impersonate system:serviceaccount:perm-a:default, list configmaps rv=0", permGet(cmA+"?"+rv0, "Impersonate-User", "system:serviceaccount:perm-a:default"), 403)
	add(saImp, "impersonate perm-erin", permGet(cmA, "Impersonate-User", "perm-erin"), 403)

	// The Node authorizer: the node reads the ConfigMap its pod mounts, by name, a list or a
	// watch pinned to it by metadata.name included; nothing else.
	items(add(node, "node: list perm-cm1 by field selector rv=0 (cached)", permGet(cmA+"?"+fs("perm-cm1")+"&"+rv0), 200))
	add(node, "node: watch perm-cm1 by field selector rv=0 (cached)", permWatch(cmA+"?"+fs("perm-cm1")+"&watch=1&"+rv0), 200)
	add(node, "node: watch perm-cm1 by field selector", permWatch(cmA+"?"+fs("perm-cm1")+"&watch=1"), 200)
	items(add(node, "node: list perm-cm1 by field selector", permGet(cmA+"?"+fs("perm-cm1")), 200))
	items(add(node, "node: list perm-cm1 by field selector == rv=0", permGet(cmA+"?fieldSelector=metadata.name%3D%3Dperm-cm1&"+rv0), 200))
	items(add(node, "node: list its Node by field selector rv=0", permGet("/api/v1/nodes?"+fs(permNode)+"&"+rv0), 200))
	add(node, "node: get perm-cm1", permGet(cmA+"/perm-cm1"), 200)
	add(node, "node: get perm-cm2 (no pod of it mounts it)", permGet(cmA+"/perm-cm2"), 403)
	add(node, "node: list perm-cm2 by field selector rv=0", permGet(cmA+"?"+fs("perm-cm2")+"&"+rv0), 403)
	add(node, "node: list perm-cm2 by field selector", permGet(cmA+"?"+fs("perm-cm2")), 403)
	add(node, "node: list configmaps perm-a rv=0", permGet(cmA+"?"+rv0), 403)
	add(node, "node: list perm-secret by field selector rv=0", permGet(secA+"?fieldSelector=metadata.name%3Dperm-secret&"+rv0), 403)
	items(add(node, "node: two fieldSelectors perm-cm1, perm-cm2 rv=0", permGet(cmA+"?"+fs("perm-cm1")+"&"+fs("perm-cm2")+"&"+rv0), 200))
	add(node, "node: two fieldSelectors perm-cm2, perm-cm1 rv=0", permGet(cmA+"?"+fs("perm-cm2")+"&"+fs("perm-cm1")+"&"+rv0), 403)
	add(node, "node: two fieldSelectors perm-cm2, perm-cm1", permGet(cmA+"?"+fs("perm-cm2")+"&"+fs("perm-cm1")), 403)

	// Anonymous: system:public-info-viewer grants /healthz, /livez, /readyz and /version, no
	// sub-path.
	for _, p := range []string{"/readyz", "/livez", "/healthz", "/version", "/readyz?verbose=1"} {
		add(anonymous, "anonymous "+p, permGet(p), 200)
	}
	for _, p := range []string{"/readyz/upstream", "/readyz/proxy-caches-synced", "/livez/ping", "/healthz/ping", "/readyz/etcd", "/metrics"} {
		add(anonymous, "anonymous "+p, permGet(p), 403)
	}
	add(anonymous, "anonymous list configmaps perm-a rv=0", permGet(cmA+"?"+rv0), 403)
	add(anonymous, "anonymous selfsubjectreview", permSSR(), 0)
	r := add(admin, "admin /readyz/upstream", permGet("/readyz/upstream"), 404)
	r.wantProxy, r.why = 200, "documented difference: the proxy's own check of its upstream"
	add(admin, "admin /livez/ping", permGet("/livez/ping"), 200)
	// A field selector a kind does not have: metadata.namespace on a cluster-scoped kind.
	add(admin, "admin nodes by metadata.namespace rv=0", permGet("/api/v1/nodes?fieldSelector=metadata.namespace%3Dx&"+rv0), 400)
	add(admin, "admin namespaces by metadata.namespace watch rv=0", permGet("/api/v1/namespaces?watch=1&fieldSelector=metadata.namespace%3Dx&"+rv0), 400)

	runPermRows(t, pc, rows, 80*time.Second)

	t.Run("identity", func(t *testing.T) { permIdentities(t, e, pc) })
}

// permIdentities compares status.userInfo of a SelfSubjectReview, upstream and through the
// proxy, for identities of every kind.
func permIdentities(t *testing.T, e *env, pc *permClients) {
	kube := e.clients(t, e.upstream)
	c := ctx(t)
	sa, err := kube.CoreV1().ServiceAccounts(permA).Create(c, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "perm-ssr"}}, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		sa, err = kube.CoreV1().ServiceAccounts(permA).Get(c, "perm-ssr", metav1.GetOptions{})
	}
	if err != nil {
		t.Fatal(err)
	}
	tr, err := kube.CoreV1().ServiceAccounts(permA).CreateToken(c, sa.Name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr(int64(600))},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	uid := pkix.Name{ExtraNames: []pkix.AttributeTypeAndValue{
		{Type: oidCN, Value: "perm-uid-user"},
		{Type: oidUID, Value: permUTF8("perm-uid-1")},
		{Type: asn1.ObjectIdentifier{2, 5, 4, 10}, Value: "perm-team"},
	}}
	type identity struct {
		cred     *permCred
		wantUser string
		wantUID  string
	}
	for _, id := range []identity{
		{permUser(t, e, "perm-ssr-user", "perm-g1", "perm-g2"), "perm-ssr-user", ""},
		{permCertCred(t, e, "perm-uid-user (uid perm-uid-1)", uid), "perm-uid-user", "perm-uid-1"},
		{permCertCred(t, e, "CN=perm-nobody then CN=perm-reader", permCNs("perm-nobody", "perm-reader")), "perm-reader", ""},
		{&permCred{name: "serviceaccount perm-a/perm-ssr token", token: tr.Status.Token}, "system:serviceaccount:perm-a:perm-ssr", string(sa.UID)},
		{permAdmin(t, e), "admin", ""},
	} {
		d := pc.do(context.Background(), id.cred, false, false, permSSR())
		p := pc.do(context.Background(), id.cred, true, false, permSSR())
		du, derr := userInfoOf(d)
		pu, perr := userInfoOf(p)
		if derr != nil {
			t.Errorf("%s upstream: %v", id.cred.name, derr)
			continue
		}
		if perr != nil {
			t.Errorf("%s through the proxy: %v", id.cred.name, perr)
			continue
		}
		t.Logf("%s:\n  upstream %s\n  proxy    %s", id.cred.name, userInfoString(du), userInfoString(pu))
		if du.Username != id.wantUser || du.UID != id.wantUID {
			t.Errorf("%s: the upstream sees %q (uid %q), the test assumes %q (uid %q)", id.cred.name, du.Username, du.UID, id.wantUser, id.wantUID)
		}
		if id.cred.der != nil {
			sum := sha256.Sum256(id.cred.der)
			want := "X509SHA256=" + hex.EncodeToString(sum[:])
			if got := du.Extra["authentication.kubernetes.io/credential-id"]; len(got) != 1 || got[0] != want {
				t.Errorf("%s: the upstream's credential-id is %v, the test assumes %s", id.cred.name, got, want)
			}
		}
		if userInfoString(du) != userInfoString(pu) {
			t.Errorf("%s: the upstream sees the caller otherwise through the proxy:\n  upstream %s\n  proxy    %s", id.cred.name, userInfoString(du), userInfoString(pu))
		}
	}
}

func userInfoOf(a permAnswer) (authenticationv1.UserInfo, error) {
	if a.err != nil {
		return authenticationv1.UserInfo{}, a.err
	}
	if a.code != http.StatusCreated {
		return authenticationv1.UserInfo{}, fmt.Errorf("%d: %.300s", a.code, a.body)
	}
	var r authenticationv1.SelfSubjectReview
	if err := json.Unmarshal(a.body, &r); err != nil {
		return authenticationv1.UserInfo{}, err
	}
	return r.Status.UserInfo, nil
}

// userInfoString is a UserInfo with its groups and extra values as sets (sorted).
func userInfoString(u authenticationv1.UserInfo) string {
	groups := append([]string(nil), u.Groups...)
	sort.Strings(groups)
	var keys []string
	for k := range u.Extra {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var extra []string
	for _, k := range keys {
		v := append([]string(nil), u.Extra[k]...)
		sort.Strings(v)
		extra = append(extra, fmt.Sprintf("%s=%q", k, v))
	}
	return fmt.Sprintf("username=%q uid=%q groups=%q extra={%s}", u.Username, u.UID, groups, strings.Join(extra, " "))
}
