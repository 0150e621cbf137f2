package proxy

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
)

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return c
}

// namespace creates a namespace upstream for one test, with the `default` ServiceAccount a
// controller-manager would make (pod admission needs it), and deletes it afterwards.
func namespace(t *testing.T, e *env, prefix string) string {
	t.Helper()
	kube := e.clients(t, e.upstream)
	ns, err := kube.CoreV1().Namespaces().Create(ctx(t), &corev1.Namespace{
		ObjectMeta: metav1.ObjectMeta{GenerateName: prefix + "-"},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = kube.CoreV1().Namespaces().Delete(context.Background(), ns.Name, metav1.DeleteOptions{})
	})
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}
	if _, err := kube.CoreV1().ServiceAccounts(ns.Name).Create(ctx(t), sa, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return ns.Name
}

func TestProxyIsReady(t *testing.T) {
	e := getEnv(t)
	// Probes need no credential, as kube-apiserver's.
	client := e.clients(t, rest.AnonymousClientConfig(e.proxy)).Discovery().RESTClient()
	for _, path := range []string{"/readyz", "/livez", "/healthz"} {
		body, err := client.Get().AbsPath(path).DoRaw(ctx(t))
		if err != nil || string(body) != "ok" {
			t.Errorf("GET %s: %q, %v", path, body, err)
		}
	}
	// A single check is for whom the upstream lets read its path: not an anonymous caller
	// (kube-apiserver's public-info-viewer role grants the bare endpoints only), the admin.
	if _, err := client.Get().AbsPath("/readyz/upstream").DoRaw(ctx(t)); !apierrors.IsForbidden(err) {
		t.Errorf("anonymous GET /readyz/upstream: want 403, got %v", err)
	}
	admin := e.clients(t, e.proxy).Discovery().RESTClient()
	if body, err := admin.Get().AbsPath("/readyz/upstream").DoRaw(ctx(t)); err != nil || string(body) != "ok" {
		t.Errorf("GET /readyz/upstream as the admin: %q, %v", body, err)
	}
	// Anything else without a credential is 401.
	_, err := client.Get().AbsPath("/api/v1/namespaces").DoRaw(ctx(t))
	if !apierrors.IsUnauthorized(err) {
		t.Errorf("anonymous list of namespaces: want 401, got %v", err)
	}
}

func TestPodsThroughProxy(t *testing.T) {
	e := getEnv(t)
	ns := namespace(t, e, "proxy-pods")
	proxy := e.clients(t, e.proxy)
	direct := e.clients(t, e.upstream)
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "p", Labels: map[string]string{"app": "x"}},
		Spec: corev1.PodSpec{
			Containers: []corev1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10"}},
		},
	}
	created, err := proxy.CoreV1().Pods(ns).Create(ctx(t), pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	got, err := direct.CoreV1().Pods(ns).Get(ctx(t), "p", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.UID != created.UID {
		t.Errorf("the pod created through the proxy is not the upstream's: %s vs %s", created.UID, got.UID)
	}
	list, err := proxy.CoreV1().Pods(ns).List(ctx(t), metav1.ListOptions{LabelSelector: "app=x"})
	if err != nil || len(list.Items) != 1 {
		t.Fatalf("list through the proxy: %v, %v", list, err)
	}
	// A protobuf client passes through too.
	pcfg := rest.CopyConfig(e.proxy)
	pcfg.ContentType = "application/vnd.kubernetes.protobuf"
	pb := e.clients(t, pcfg)
	if _, err := pb.CoreV1().Pods(ns).Get(ctx(t), "p", metav1.GetOptions{}); err != nil {
		t.Errorf("protobuf get through the proxy: %v", err)
	}
	if err := proxy.CoreV1().Pods(ns).Delete(ctx(t), "p", metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
	_, err = proxy.CoreV1().Pods(ns).Get(ctx(t), "missing", metav1.GetOptions{})
	if !apierrors.IsNotFound(err) {
		t.Errorf("a missing pod: want 404, got %v", err)
	}
}

func TestWatchThroughProxy(t *testing.T) {
	e := getEnv(t)
	ns := namespace(t, e, "proxy-watch")
	proxy := e.clients(t, e.proxy)
	direct := e.clients(t, e.upstream)
	w, err := proxy.CoreV1().ConfigMaps(ns).Watch(ctx(t), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "cm"}, Data: map[string]string{"k": "1"}}
	if _, err := direct.CoreV1().ConfigMaps(ns).Create(ctx(t), cm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	cm.Data["k"] = "2"
	if _, err := direct.CoreV1().ConfigMaps(ns).Update(ctx(t), cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := direct.CoreV1().ConfigMaps(ns).Delete(ctx(t), "cm", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	want := []watch.EventType{watch.Added, watch.Modified, watch.Deleted}
	for i, typ := range want {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				t.Fatalf("the watch ended after %d events", i)
			}
			c, _ := ev.Object.(*corev1.ConfigMap)
			if ev.Type != typ || c == nil || c.Name != "cm" {
				t.Fatalf("event %d: %s %#v, want %s of cm", i, ev.Type, ev.Object, typ)
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("no %s event through the proxy", typ)
		}
	}
}

func TestCustomResourceThroughProxy(t *testing.T) {
	e := getEnv(t)
	ns := namespace(t, e, "proxy-crd")
	group := fmt.Sprintf("g%d.proxy.example.com", time.Now().UnixNano())
	crds := schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
	crd := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "apiextensions.k8s.io/v1",
		"kind":       "CustomResourceDefinition",
		"metadata":   map[string]any{"name": "widgets." + group},
		"spec": map[string]any{
			"group": group,
			"scope": "Namespaced",
			"names": map[string]any{"plural": "widgets", "singular": "widget", "kind": "Widget", "listKind": "WidgetList"},
			"versions": []any{map[string]any{
				"name": "v1", "served": true, "storage": true,
				"schema": map[string]any{"openAPIV3Schema": map[string]any{
					"type":                                 "object",
					"x-kubernetes-preserve-unknown-fields": true,
				}},
			}},
		},
	}}
	directDyn, err := dynamic.NewForConfig(e.upstream)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := directDyn.Resource(crds).Create(ctx(t), crd, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = directDyn.Resource(crds).Delete(context.Background(), "widgets."+group, metav1.DeleteOptions{})
	})
	proxyDyn, err := dynamic.NewForConfig(e.proxy)
	if err != nil {
		t.Fatal(err)
	}
	widgets := schema.GroupVersionResource{Group: group, Version: "v1", Resource: "widgets"}
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": group + "/v1",
		"kind":       "Widget",
		"metadata":   map[string]any{"name": "w1"},
		"spec":       map[string]any{"size": int64(3)},
	}}
	// The CRD is served upstream once it is established; the proxy knows nothing of it.
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err = proxyDyn.Resource(widgets).Namespace(ns).Create(ctx(t), obj, metav1.CreateOptions{})
		if err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("creating a widget through the proxy: %v", err)
	}
	list, err := proxyDyn.Resource(widgets).Namespace(ns).List(ctx(t), metav1.ListOptions{})
	if err != nil || len(list.Items) != 1 {
		t.Fatalf("listing widgets through the proxy: %v, %v", list, err)
	}
	got, err := directDyn.Resource(widgets).Namespace(ns).Get(ctx(t), "w1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if size, _, _ := unstructured.NestedInt64(got.Object, "spec", "size"); size != 3 {
		t.Errorf("the widget upstream: %v", got.Object)
	}
	if kubectlPath(t) != "" {
		out := kubectl(t, writeKubeconfig(t, e.proxy), "get", "widgets."+group, "-n", ns, "-o", "name")
		if strings.TrimSpace(out) != "widget."+group+"/w1" {
			t.Errorf("kubectl get widgets through the proxy: %q", out)
		}
	}
}

func kubectlPath(t *testing.T) string {
	p, err := exec.LookPath("kubectl")
	if err != nil {
		t.Log("kubectl not found: its part of the test is skipped")
		return ""
	}
	return p
}

func kubectl(t *testing.T, kubeconfig string, args ...string) string {
	t.Helper()
	out, err := kubectlErr(t, kubeconfig, args...)
	if err != nil {
		t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

func kubectlErr(t *testing.T, kubeconfig string, args ...string) (string, error) {
	t.Helper()
	all := append([]string{"--kubeconfig", kubeconfig, "--cache-dir", t.TempDir(), "--request-timeout", "30s"}, args...)
	cmd := exec.Command("kubectl", all...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func TestKubectlThroughProxy(t *testing.T) {
	e := getEnv(t)
	if kubectlPath(t) == "" {
		t.Skip("no kubectl")
	}
	ns := namespace(t, e, "proxy-kubectl")
	kc := writeKubeconfig(t, e.proxy)
	kubectl(t, kc, "create", "configmap", "c1", "-n", ns, "--from-literal=a=b")
	out := kubectl(t, kc, "get", "configmap", "c1", "-n", ns, "-o", "jsonpath={.data.a}")
	if out != "b" {
		t.Errorf("kubectl get configmap: %q", out)
	}
	pod := `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"kp"},"spec":{"containers":[{"name":"c","image":"registry.k8s.io/pause:3.10"}]}}`
	cmd := exec.Command("kubectl", "--kubeconfig", kc, "--cache-dir", t.TempDir(), "apply", "--server-side", "-n", ns, "-f", "-")
	cmd.Stdin = strings.NewReader(pod)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("kubectl apply: %v\n%s", err, b)
	}
	out = kubectl(t, kc, "get", "pods", "-n", ns, "-o", "name")
	if strings.TrimSpace(out) != "pod/kp" {
		t.Errorf("kubectl get pods: %q", out)
	}
	out = kubectl(t, kc, "auth", "whoami", "-o", "jsonpath={.status.userInfo.username}")
	if out != "admin" {
		t.Errorf("kubectl auth whoami through the proxy: %q, want admin", out)
	}
	kubectl(t, kc, "delete", "pod", "kp", "-n", ns, "--grace-period=0", "--wait=false")
	// Discovery and OpenAPI pass through: kubectl explain needs both.
	if out := kubectl(t, kc, "explain", "pods.spec.nodeName"); !strings.Contains(out, "nodeName") {
		t.Errorf("kubectl explain through the proxy: %q", out)
	}
}

// alice may read configmaps in one namespace only (a Role and RoleBinding upstream).
func setUpAlice(t *testing.T, e *env) (allowed, other string) {
	t.Helper()
	allowed = namespace(t, e, "proxy-alice")
	other = namespace(t, e, "proxy-other")
	direct := e.clients(t, e.upstream)
	role := &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: "cm-reader"},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "list", "watch"}}},
	}
	if _, err := direct.RbacV1().Roles(allowed).Create(ctx(t), role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	binding := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "alice"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "cm-reader"},
		Subjects:   []rbacv1.Subject{{APIGroup: "rbac.authorization.k8s.io", Kind: "User", Name: "alice"}},
	}
	if _, err := direct.RbacV1().RoleBindings(allowed).Create(ctx(t), binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return allowed, other
}

// statusOf is the Status of a failed call (code, reason, message).
func statusOf(err error) metav1.Status {
	var s apierrors.APIStatus
	if e, ok := err.(apierrors.APIStatus); ok {
		s = e
		return s.Status()
	}
	return metav1.Status{Message: fmt.Sprint(err)}
}

func sameRefusal(t *testing.T, what string, direct, proxied error) {
	t.Helper()
	d, p := statusOf(direct), statusOf(proxied)
	if d.Code != http.StatusForbidden || p.Code != d.Code || p.Reason != d.Reason || p.Message != d.Message {
		t.Errorf("%s:\n direct:  %d %s %q\n proxied: %d %s %q", what, d.Code, d.Reason, d.Message, p.Code, p.Reason, p.Message)
	}
}

func TestRBACThroughProxy(t *testing.T) {
	e := getEnv(t)
	allowed, other := setUpAlice(t, e)
	aliceDirect := e.userConfig(t, "alice", "dev")
	aliceProxy := e.throughProxy(aliceDirect)
	direct, proxy := e.clients(t, aliceDirect), e.clients(t, aliceProxy)
	// RBAC is read at once by the authorizer's informers; give them a moment.
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := direct.CoreV1().ConfigMaps(allowed).List(ctx(t), metav1.ListOptions{})
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("alice cannot list configmaps upstream: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if _, err := proxy.CoreV1().ConfigMaps(allowed).List(ctx(t), metav1.ListOptions{}); err != nil {
		t.Errorf("alice's list in her namespace through the proxy: %v", err)
	}
	_, dErr := direct.CoreV1().ConfigMaps(other).List(ctx(t), metav1.ListOptions{})
	_, pErr := proxy.CoreV1().ConfigMaps(other).List(ctx(t), metav1.ListOptions{})
	sameRefusal(t, "alice lists another namespace", dErr, pErr)
	_, dErr = direct.CoreV1().Secrets(allowed).List(ctx(t), metav1.ListOptions{})
	_, pErr = proxy.CoreV1().Secrets(allowed).List(ctx(t), metav1.ListOptions{})
	sameRefusal(t, "alice lists secrets", dErr, pErr)
	// The proxy's own /metrics: as kube-apiserver's, for whom RBAC lets get the path.
	_, dErr = direct.Discovery().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx(t))
	_, pErr = proxy.Discovery().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx(t))
	sameRefusal(t, "alice reads /metrics", dErr, pErr)
	metrics, err := e.clients(t, e.proxy).Discovery().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx(t))
	if err != nil || !strings.Contains(string(metrics), "apiserver_request_total{") {
		t.Errorf("admin reads the proxy's /metrics: %v\n%.300s", err, metrics)
	}
	// The upstream sees alice, with her groups.
	review, err := proxy.AuthenticationV1().SelfSubjectReviews().Create(ctx(t), &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	u := review.Status.UserInfo
	if u.Username != "alice" || !contains(u.Groups, "dev") || !contains(u.Groups, "system:authenticated") {
		t.Errorf("alice through the proxy is seen upstream as %+v", u)
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func TestCallerImpersonationThroughProxy(t *testing.T) {
	e := getEnv(t)
	allowed, other := setUpAlice(t, e)
	aliceDirect := e.userConfig(t, "alice")
	// alice may not impersonate: the proxy asks the upstream and refuses as it refuses.
	asAdmin := func(c *rest.Config) *rest.Config {
		c = rest.CopyConfig(c)
		c.Impersonate = rest.ImpersonationConfig{UserName: "admin", Groups: []string{"system:masters"}}
		return c
	}
	// The message differs: kube-apiserver 1.37 reports its constrained-impersonation check
	// (impersonate-on:<mode>:<verb> on the request's resource), which the proxy does not ask
	// (it honours the legacy impersonate grants only, so it refuses at least what the upstream
	// refuses); the code and reason are the same.
	_, dErr := e.clients(t, asAdmin(aliceDirect)).CoreV1().ConfigMaps(other).List(ctx(t), metav1.ListOptions{})
	_, pErr := e.clients(t, e.throughProxy(asAdmin(aliceDirect))).CoreV1().ConfigMaps(other).List(ctx(t), metav1.ListOptions{})
	d, p := statusOf(dErr), statusOf(pErr)
	if d.Code != http.StatusForbidden || p.Code != d.Code || p.Reason != d.Reason ||
		!strings.Contains(p.Message, `User "alice" cannot impersonate resource "users"`) {
		t.Errorf("alice impersonates admin:\n direct:  %d %s %q\n proxied: %d %s %q", d.Code, d.Reason, d.Message, p.Code, p.Reason, p.Message)
	}

	// Front-proxy headers from a caller are dropped: alice stays alice.
	remote := rest.CopyConfig(e.throughProxy(aliceDirect))
	remote.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		return headerAdder{rt, map[string]string{"X-Remote-User": "admin", "X-Remote-Group": "system:masters"}}
	}
	_, err := e.clients(t, remote).CoreV1().ConfigMaps(other).List(ctx(t), metav1.ListOptions{})
	if !apierrors.IsForbidden(err) {
		t.Errorf("alice with X-Remote-User: admin through the proxy: want 403, got %v", err)
	}

	// An administrator may impersonate (the upstream allows system:masters), through the proxy
	// as directly: as alice, the answers are alice's.
	adminAsAlice := rest.CopyConfig(e.proxy)
	adminAsAlice.Impersonate = rest.ImpersonationConfig{UserName: "alice", Groups: []string{"dev"}, Extra: map[string][]string{"example.com/team": {"blue"}}}
	asAlice := e.clients(t, adminAsAlice)
	if _, err := asAlice.CoreV1().ConfigMaps(allowed).List(ctx(t), metav1.ListOptions{}); err != nil {
		t.Errorf("admin as alice in her namespace through the proxy: %v", err)
	}
	directAsAlice := rest.CopyConfig(e.upstream)
	directAsAlice.Impersonate = adminAsAlice.Impersonate
	_, dErr = e.clients(t, directAsAlice).CoreV1().ConfigMaps(other).List(ctx(t), metav1.ListOptions{})
	_, pErr = asAlice.CoreV1().ConfigMaps(other).List(ctx(t), metav1.ListOptions{})
	sameRefusal(t, "admin as alice lists another namespace", dErr, pErr)
	review, err := asAlice.AuthenticationV1().SelfSubjectReviews().Create(ctx(t), &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	u := review.Status.UserInfo
	if u.Username != "alice" || !contains(u.Groups, "dev") || len(u.Extra["example.com/team"]) != 1 {
		t.Errorf("admin as alice through the proxy is seen upstream as %+v", u)
	}
}

type headerAdder struct {
	rt      http.RoundTripper
	headers map[string]string
}

func (h headerAdder) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	for k, v := range h.headers {
		r.Header.Set(k, v)
	}
	return h.rt.RoundTrip(r)
}

func TestServiceAccountTokenThroughProxy(t *testing.T) {
	e := getEnv(t)
	ns := namespace(t, e, "proxy-token")
	direct := e.clients(t, e.upstream)
	sa, err := direct.CoreV1().ServiceAccounts(ns).Create(ctx(t), &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "robot"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// A Role of its own: the aggregated ClusterRoles (view, edit) stay empty without a
	// controller-manager.
	role := &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: "cm-reader"},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "list", "watch"}}},
	}
	if _, err := direct.RbacV1().Roles(ns).Create(ctx(t), role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	binding := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "robot"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "cm-reader"},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: "robot", Namespace: ns}},
	}
	if _, err := direct.RbacV1().RoleBindings(ns).Create(ctx(t), binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	tr, err := direct.CoreV1().ServiceAccounts(ns).CreateToken(ctx(t), sa.Name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr(int64(600))},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := rest.AnonymousClientConfig(e.proxy)
	cfg.BearerToken = tr.Status.Token
	proxy := e.clients(t, cfg)
	review, err := proxy.AuthenticationV1().SelfSubjectReviews().Create(ctx(t), &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	u := review.Status.UserInfo
	want := "system:serviceaccount:" + ns + ":robot"
	if u.Username != want || u.UID != string(sa.UID) || !contains(u.Groups, "system:serviceaccounts:"+ns) {
		t.Errorf("the token through the proxy is seen upstream as %+v, want %s (uid %s)", u, want, sa.UID)
	}
	if len(u.Extra["authentication.kubernetes.io/credential-id"]) == 0 {
		t.Errorf("the token's extras did not reach the upstream: %+v", u.Extra)
	}
	if _, err := proxy.CoreV1().ConfigMaps(ns).List(ctx(t), metav1.ListOptions{}); err != nil {
		t.Errorf("the robot lists configmaps through the proxy: %v", err)
	}
	_, err = proxy.CoreV1().Secrets(ns).List(ctx(t), metav1.ListOptions{})
	if !apierrors.IsForbidden(err) {
		t.Errorf("the robot lists secrets through the proxy: want 403, got %v", err)
	}
	bad := rest.AnonymousClientConfig(e.proxy)
	bad.BearerToken = "not-a-token"
	_, err = e.clients(t, bad).CoreV1().ConfigMaps(ns).List(ctx(t), metav1.ListOptions{})
	if !apierrors.IsUnauthorized(err) {
		t.Errorf("a bad token through the proxy: want 401, got %v", err)
	}
	// A JSON Status, as kube-apiserver writes one.
	raw, _ := json.Marshal(statusOf(err))
	t.Logf("bad token: %s", raw)
}

func ptr[T any](v T) *T { return &v }
