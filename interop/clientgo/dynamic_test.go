package clientgo

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net/http"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
)

func newEvent(tg *target, ns, name, reason string) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion":          tg.group("events") + "/v1",
		"kind":                "Event",
		"metadata":            map[string]any{"name": name, "namespace": ns},
		"eventTime":           time.Now().UTC().Format("2006-01-02T15:04:05.000000Z07:00"),
		"reportingController": "interop.example.com/tests",
		"reportingInstance":   "interop-1",
		"action":              "Testing",
		"reason":              reason,
		"type":                "Normal",
		"note":                "made by the interop tests",
		"regarding": map[string]any{
			"apiVersion": "v1", "kind": "ServiceAccount", "namespace": ns, "name": "subject",
		},
	}}
}

// rawDelete sends a DELETE with a plain REST client and decodes the body's kind.
func rawDelete(ctx context.Context, tg *target, absPath string) (string, error) {
	hc, err := rest.HTTPClientFor(tg.cfg)
	if err != nil {
		return "", err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodDelete, strings.TrimSuffix(tg.cfg.Host, "/")+absPath, nil)
	if err != nil {
		return "", err
	}
	req.Header.Set("Accept", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("DELETE %s: %d %s", absPath, resp.StatusCode, body)
	}
	var head struct {
		Kind   string `json:"kind"`
		Status string `json:"status"`
	}
	if err := json.Unmarshal(body, &head); err != nil {
		return "", fmt.Errorf("%s: %v", body, err)
	}
	return head.Kind + "/" + head.Status, nil
}

// TestDynamicEvents drives events.k8s.io/v1 (events.svc.io/v1 on the gateway) with the dynamic
// client: create, get, list with a field selector, watch, update, an invalid update, patch and
// delete.
func TestDynamicEvents(t *testing.T) {
	tg := getTarget(t)
	ctx := context.Background()
	ns := newNamespace(t, tg, "ev")
	events := tg.dyn.Resource(tg.gvr("events", "events")).Namespace(ns)

	created, err := events.Create(ctx, newEvent(tg, ns, "first", "Tested"), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	if got := created.GetAPIVersion(); got != tg.group("events")+"/v1" {
		t.Fatalf("apiVersion %q, want %q", got, tg.group("events")+"/v1")
	}
	got, err := events.Get(ctx, "first", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get: %v", err)
	}
	if note, _, _ := unstructured.NestedString(got.Object, "note"); note != "made by the interop tests" {
		t.Fatalf("note %q", note)
	}

	list, err := events.List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatalf("list: %v", err)
	}
	w, err := events.Watch(ctx, metav1.ListOptions{ResourceVersion: list.GetResourceVersion()})
	if err != nil {
		t.Fatalf("watch: %v", err)
	}
	defer w.Stop()
	if _, err := events.Create(ctx, newEvent(tg, ns, "second", "Other"), metav1.CreateOptions{}); err != nil {
		t.Fatalf("create second: %v", err)
	}
	select {
	case ev := <-w.ResultChan():
		u, ok := ev.Object.(*unstructured.Unstructured)
		if ev.Type != watch.Added || !ok || u.GetName() != "second" {
			t.Fatalf("watch event %s %v, want ADDED second", ev.Type, ev.Object)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("no watch event for the second Event")
	}

	sel, err := events.List(ctx, metav1.ListOptions{FieldSelector: "reason=Tested"})
	if err != nil {
		t.Fatalf("list reason=Tested: %v", err)
	}
	if len(sel.Items) != 1 || sel.Items[0].GetName() != "first" {
		t.Fatalf("field selector reason=Tested: %d items", len(sel.Items))
	}

	// Metadata may change on update; the note may not (events.k8s.io/v1 update validation).
	got.SetLabels(map[string]string{"updated": "yes"})
	updated, err := events.Update(ctx, got, metav1.UpdateOptions{})
	if err != nil {
		t.Fatalf("update labels: %v", err)
	}
	bad := updated.DeepCopy()
	if err := unstructured.SetNestedField(bad.Object, "a different note", "note"); err != nil {
		t.Fatal(err)
	}
	if _, err := events.Update(ctx, bad, metav1.UpdateOptions{}); !apierrors.IsInvalid(err) {
		t.Fatalf("update of note: %v, want 422 Invalid", err)
	}
	patched, err := events.Patch(ctx, "first", types.MergePatchType, []byte(`{"metadata":{"annotations":{"a":"b"}}}`), metav1.PatchOptions{})
	if err != nil {
		t.Fatalf("merge patch: %v", err)
	}
	if patched.GetAnnotations()["a"] != "b" {
		t.Fatalf("patch not applied: %v", patched.GetAnnotations())
	}

	if err := events.Delete(ctx, "second", metav1.DeleteOptions{}); err != nil {
		t.Fatalf("delete: %v", err)
	}
	if _, err := events.Get(ctx, "second", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("get after delete: %v, want 404", err)
	}
	// kube-apiserver answers an Event's DELETE with a Status (the events registry does not set
	// ReturnDeletedObject), as the spec's operation table says.
	t.Run("DeleteAnswersStatus", func(t *testing.T) {
		kind, err := rawDelete(ctx, tg, fmt.Sprintf("/apis/%s/v1/namespaces/%s/events/first", tg.group("events"), ns))
		if err != nil {
			t.Fatalf("raw delete: %v", err)
		}
		if kind == "Event/" && tg.suffix == "svc.io" {
			t.Skip("known difference: see FINDINGS.md #1 (DELETE of an Event answers the Event, want Status/Success)")
		}
		if kind != "Status/Success" {
			t.Fatalf("DELETE of an Event answered %s, want Status/Success", kind)
		}
	})
}

func newCSR(t *testing.T, tg *target, name, signer string) *unstructured.Unstructured {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		Subject: pkix.Name{CommonName: "interop-" + name, Organization: []string{"interop"}},
	}, key)
	if err != nil {
		t.Fatal(err)
	}
	csrPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der})
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": tg.group("certificates") + "/v1",
		"kind":       "CertificateSigningRequest",
		"metadata":   map[string]any{"name": name},
		"spec": map[string]any{
			"request":    base64.StdEncoding.EncodeToString(csrPEM),
			"signerName": signer,
			"usages":     []any{"digital signature", "key encipherment", "client auth"},
		},
	}}
}

func setCondition(u *unstructured.Unstructured, typ string) {
	_ = unstructured.SetNestedSlice(u.Object, []any{map[string]any{
		"type": typ, "status": "True", "reason": "InteropTest", "message": "set by the interop tests",
	}}, "status", "conditions")
}

func conditionTypes(u *unstructured.Unstructured) []string {
	conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	var out []string
	for _, c := range conds {
		if m, ok := c.(map[string]any); ok {
			out = append(out, fmt.Sprint(m["type"], "=", m["status"]))
		}
	}
	return out
}

// TestDynamicCSR drives CertificateSigningRequests with the dynamic client: create, get, list
// by signerName, approve and deny through the approval subresource, and the rule that an
// approved request cannot also be denied. The signer is one nobody runs, so no controller
// touches the requests.
func TestDynamicCSR(t *testing.T) {
	tg := getTarget(t)
	ctx := context.Background()
	csrs := tg.dyn.Resource(tg.gvr("certificates", "certificatesigningrequests"))
	run := randSuffix()
	signer := "interop.example.com/signer-" + run
	names := []string{"approve-" + run, "deny-" + run}
	t.Cleanup(func() {
		for _, n := range names {
			_ = csrs.Delete(context.Background(), n, metav1.DeleteOptions{})
		}
	})
	for _, n := range names {
		if _, err := csrs.Create(ctx, newCSR(t, tg, n, signer), metav1.CreateOptions{}); err != nil {
			t.Fatalf("create %s: %v", n, err)
		}
	}
	got, err := csrs.Get(ctx, names[0], metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get: %v", err)
	}
	if user, _, _ := unstructured.NestedString(got.Object, "spec", "username"); user != "admin" {
		t.Fatalf("spec.username %q, want the requester admin", user)
	}
	list, err := csrs.List(ctx, metav1.ListOptions{FieldSelector: "spec.signerName=" + signer})
	if err != nil {
		t.Fatalf("list by signerName: %v", err)
	}
	if len(list.Items) != 2 {
		t.Fatalf("list by signerName: %d items, want 2", len(list.Items))
	}

	setCondition(got, "Approved")
	approved, err := csrs.Update(ctx, got, metav1.UpdateOptions{}, "approval")
	if err != nil {
		t.Fatalf("approve: %v", err)
	}
	if c := conditionTypes(approved); len(c) != 1 || c[0] != "Approved=True" {
		t.Fatalf("conditions after approval %v", c)
	}
	again, err := csrs.Get(ctx, names[0], metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if c := conditionTypes(again); len(c) != 1 || c[0] != "Approved=True" {
		t.Fatalf("conditions read back %v", c)
	}
	// Approved and Denied together are invalid.
	both := again.DeepCopy()
	conds, _, _ := unstructured.NestedSlice(both.Object, "status", "conditions")
	conds = append(conds, map[string]any{"type": "Denied", "status": "True", "reason": "InteropTest"})
	_ = unstructured.SetNestedSlice(both.Object, conds, "status", "conditions")
	if _, err := csrs.Update(ctx, both, metav1.UpdateOptions{}, "approval"); !apierrors.IsInvalid(err) {
		t.Fatalf("approve and deny together: %v, want 422 Invalid", err)
	}
	// A plain update does not change conditions: they belong to the approval subresource.
	plain := again.DeepCopy()
	setCondition(plain, "Denied")
	afterPlain, err := csrs.Update(ctx, plain, metav1.UpdateOptions{})
	if err != nil {
		t.Fatalf("plain update: %v", err)
	}
	if c := conditionTypes(afterPlain); len(c) != 1 || c[0] != "Approved=True" {
		t.Fatalf("conditions after a plain update %v, want them unchanged", c)
	}

	deny, err := csrs.Get(ctx, names[1], metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	setCondition(deny, "Denied")
	denied, err := csrs.Update(ctx, deny, metav1.UpdateOptions{}, "approval")
	if err != nil {
		t.Fatalf("deny: %v", err)
	}
	if c := conditionTypes(denied); len(c) != 1 || c[0] != "Denied=True" {
		t.Fatalf("conditions after denial %v", c)
	}

	// The signer's part: the certificate goes in through /status, once. (kube-apiserver also
	// accepts a certificate on a denied request; that is left alone here.)
	t.Run("StatusCertificate", func(t *testing.T) {
		cur, err := csrs.Get(ctx, names[0], metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		_ = unstructured.SetNestedField(cur.Object, base64.StdEncoding.EncodeToString(selfSignedPEM(t, "first")), "status", "certificate")
		issued, err := csrs.Update(ctx, cur, metav1.UpdateOptions{}, "status")
		if err != nil {
			t.Fatalf("set status.certificate: %v", err)
		}
		if c, _, _ := unstructured.NestedString(issued.Object, "status", "certificate"); c == "" {
			t.Fatal("status.certificate not stored")
		}
		if c := conditionTypes(issued); len(c) != 1 || c[0] != "Approved=True" {
			t.Fatalf("conditions after /status %v", c)
		}
		_ = unstructured.SetNestedField(issued.Object, base64.StdEncoding.EncodeToString(selfSignedPEM(t, "second")), "status", "certificate")
		if _, err := csrs.Update(ctx, issued, metav1.UpdateOptions{}, "status"); !apierrors.IsInvalid(err) {
			t.Fatalf("replacing an issued certificate: %v, want 422 Invalid", err)
		}
	})
}

func selfSignedPEM(t *testing.T, cn string) []byte {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: cn},
		NotBefore:    time.Now().Add(-time.Minute),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}
