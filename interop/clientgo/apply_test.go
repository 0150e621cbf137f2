package clientgo

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	applycorev1 "k8s.io/client-go/applyconfigurations/core/v1"
)

// managers returns, for each field manager of an Apply operation, its fieldsV1 JSON.
func managers(fields []metav1.ManagedFieldsEntry) map[string]string {
	out := map[string]string{}
	for _, e := range fields {
		if e.Operation != metav1.ManagedFieldsOperationApply {
			continue
		}
		raw := ""
		if e.FieldsV1 != nil {
			raw = string(e.FieldsV1.Raw)
		}
		out[e.Manager] = raw
	}
	return out
}

func conflictFields(err error) []string {
	var out []string
	if st, ok := err.(apierrors.APIStatus); ok && st.Status().Details != nil {
		for _, c := range st.Status().Details.Causes {
			if c.Type == metav1.CauseTypeFieldManagerConflict {
				out = append(out, c.Field)
			}
		}
	}
	return out
}

// TestServerSideApplyServiceAccount: typed apply configurations from two field managers, a
// conflict (409 with a FieldManagerConflict cause naming the field), force, and removal of a
// field by its sole owner.
func TestServerSideApplyServiceAccount(t *testing.T) {
	tg := getTarget(t)
	ctx := context.Background()
	ns := newNamespace(t, tg, "ssa")
	sas := tg.kube.CoreV1().ServiceAccounts(ns)

	a := applycorev1.ServiceAccount("robot", ns).
		WithLabels(map[string]string{"team": "a"}).
		WithAnnotations(map[string]string{"owner": "manager-a"})
	sa, err := sas.Apply(ctx, a, metav1.ApplyOptions{FieldManager: "manager-a"})
	if err != nil {
		t.Fatalf("apply by manager-a: %v", err)
	}
	if sa.Labels["team"] != "a" || sa.Annotations["owner"] != "manager-a" {
		t.Fatalf("after first apply: labels %v annotations %v", sa.Labels, sa.Annotations)
	}
	if m := managers(sa.ManagedFields); !strings.Contains(m["manager-a"], `"f:team"`) {
		t.Fatalf("managedFields after first apply: %v", m)
	}

	// Same apply again: a no-op, resourceVersion unchanged.
	again, err := sas.Apply(ctx, a, metav1.ApplyOptions{FieldManager: "manager-a"})
	if err != nil {
		t.Fatalf("re-apply: %v", err)
	}
	if again.ResourceVersion != sa.ResourceVersion {
		t.Fatalf("identical apply changed resourceVersion %s -> %s", sa.ResourceVersion, again.ResourceVersion)
	}

	b := applycorev1.ServiceAccount("robot", ns).WithLabels(map[string]string{"team": "b"})
	_, err = sas.Apply(ctx, b, metav1.ApplyOptions{FieldManager: "manager-b"})
	if !apierrors.IsConflict(err) {
		t.Fatalf("conflicting apply by manager-b: %v, want 409 Conflict", err)
	}
	if f := conflictFields(err); len(f) != 1 || f[0] != ".metadata.labels.team" {
		t.Fatalf("conflict causes %v, want [.metadata.labels.team]", f)
	}

	forced, err := sas.Apply(ctx, b, metav1.ApplyOptions{FieldManager: "manager-b", Force: true})
	if err != nil {
		t.Fatalf("forced apply: %v", err)
	}
	if forced.Labels["team"] != "b" {
		t.Fatalf("after force: labels %v", forced.Labels)
	}
	m := managers(forced.ManagedFields)
	if !strings.Contains(m["manager-b"], `"f:team"`) || strings.Contains(m["manager-a"], `"f:team"`) {
		t.Fatalf("after force, manager-b should own team and manager-a not: %v", m)
	}

	// What manager-a still owns, as a controller reads it back before its next apply.
	extracted, err := applycorev1.ExtractServiceAccount(forced, "manager-a")
	if err != nil {
		t.Fatalf("extract manager-a's fields: %v", err)
	}
	if extracted.Labels["team"] != "" || extracted.Annotations["owner"] != "manager-a" {
		t.Fatalf("manager-a's extracted fields: labels %v annotations %v", extracted.Labels, extracted.Annotations)
	}

	// manager-b applies without the label: as its sole owner now, that removes it.
	empty := applycorev1.ServiceAccount("robot", ns)
	removed, err := sas.Apply(ctx, empty, metav1.ApplyOptions{FieldManager: "manager-b"})
	if err != nil {
		t.Fatalf("apply without the label: %v", err)
	}
	if _, ok := removed.Labels["team"]; ok {
		t.Fatalf("label team still there: %v", removed.Labels)
	}
	if removed.Annotations["owner"] != "manager-a" {
		t.Fatalf("manager-a's annotation lost: %v", removed.Annotations)
	}
}

// TestServerSideApplySecret: apply a Secret's data from two managers; a conflict on one key,
// then force; the other manager keeps its key.
func TestServerSideApplySecret(t *testing.T) {
	tg := getTarget(t)
	ctx := context.Background()
	ns := newNamespace(t, tg, "ssa-secret")
	secrets := tg.kube.CoreV1().Secrets(ns)

	a := applycorev1.Secret("creds", ns).WithType("Opaque").
		WithData(map[string][]byte{"user": []byte("alice"), "password": []byte("one")})
	if _, err := secrets.Apply(ctx, a, metav1.ApplyOptions{FieldManager: "writer-a"}); err != nil {
		t.Fatalf("apply by writer-a: %v", err)
	}
	b := applycorev1.Secret("creds", ns).WithData(map[string][]byte{"password": []byte("two"), "extra": []byte("x")})
	_, err := secrets.Apply(ctx, b, metav1.ApplyOptions{FieldManager: "writer-b"})
	if !apierrors.IsConflict(err) {
		t.Fatalf("conflicting apply: %v, want 409 Conflict", err)
	}
	if f := conflictFields(err); len(f) != 1 || f[0] != ".data.password" {
		t.Fatalf("conflict causes %v, want [.data.password]", f)
	}
	// Nothing was written by the refused apply.
	cur, err := secrets.Get(ctx, "creds", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := cur.Data["extra"]; ok {
		t.Fatal("a refused apply wrote data")
	}
	forced, err := secrets.Apply(ctx, b, metav1.ApplyOptions{FieldManager: "writer-b", Force: true})
	if err != nil {
		t.Fatalf("forced apply: %v", err)
	}
	want := map[string]string{"user": "alice", "password": "two", "extra": "x"}
	got := map[string]string{}
	for k, v := range forced.Data {
		got[k] = string(v)
	}
	gj, _ := json.Marshal(got)
	wj, _ := json.Marshal(want)
	if string(gj) != string(wj) {
		t.Fatalf("data after force %s, want %s", gj, wj)
	}
}
