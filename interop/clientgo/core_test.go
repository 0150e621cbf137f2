package clientgo

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/restmapper"
	"k8s.io/client-go/tools/pager"
	"k8s.io/client-go/util/retry"
)

// TestCoreClientBasics: what controllers do with the typed core client besides informers:
// paginated lists through client-go's pager, optimistic concurrency with RetryOnConflict,
// dry-run, generateName, field selectors, JSON and strategic merge patches, deletecollection,
// and the answer to a version ahead of the store.
func TestCoreClientBasics(t *testing.T) {
	tg := getTarget(t)
	ctx := context.Background()
	ns := newNamespace(t, tg, "core")
	secrets := tg.kube.CoreV1().Secrets(ns)
	for i := range 7 {
		_, err := secrets.Create(ctx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("s-%d", i), Labels: map[string]string{"batch": fmt.Sprint(i % 2)}},
			Type:       corev1.SecretTypeOpaque,
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
	}

	t.Run("Pager", func(t *testing.T) {
		pages := 0
		p := pager.New(pager.SimplePageFunc(func(o metav1.ListOptions) (runtime.Object, error) {
			pages++
			l, err := secrets.List(ctx, o)
			if err == nil && pages < 3 && l.Continue == "" {
				return nil, fmt.Errorf("page %d of 3 items has no continue token", pages)
			}
			return l, err
		}))
		p.PageSize = 3
		var names []string
		err := p.EachListItem(ctx, metav1.ListOptions{}, func(o runtime.Object) error {
			m, err := meta.Accessor(o)
			if err != nil {
				return err
			}
			names = append(names, m.GetName())
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if pages != 3 || len(names) != 7 || !slices.IsSorted(names) {
			t.Fatalf("%d pages, items %v; want 3 pages of the 7 secrets in name order", pages, names)
		}
	})

	t.Run("RemainingItemCount", func(t *testing.T) {
		l, err := secrets.List(ctx, metav1.ListOptions{Limit: 2})
		if err != nil {
			t.Fatal(err)
		}
		if l.RemainingItemCount == nil || *l.RemainingItemCount != 5 || l.Continue == "" {
			t.Fatalf("limit 2 of 7: remainingItemCount %v, continue %q", l.RemainingItemCount, l.Continue)
		}
	})

	// A version the server has not reached: client-go's reflector knows the answer by its
	// ResourceVersionTooLarge cause, and then lists afresh instead of asking for it again.
	t.Run("TooLargeResourceVersion", func(t *testing.T) {
		l, err := secrets.List(ctx, metav1.ListOptions{Limit: 1})
		if err != nil {
			t.Fatal(err)
		}
		rv, err := strconv.ParseInt(l.ResourceVersion, 10, 64)
		if err != nil {
			t.Fatalf("the list's resourceVersion %q: %v", l.ResourceVersion, err)
		}
		ahead := strconv.FormatInt(rv+1_000_000, 10)
		// One request: client-go's typed List would repeat it 10 times, as the answer's
		// Retry-After header asks, each after the server's wait of about 3 s.
		err = tg.kube.CoreV1().RESTClient().Get().Namespace(ns).Resource("secrets").
			VersionedParams(&metav1.ListOptions{ResourceVersion: ahead, ResourceVersionMatch: metav1.ResourceVersionMatchNotOlderThan}, scheme.ParameterCodec).
			MaxRetries(0).Do(ctx).Error()
		if !apierrors.IsTimeout(err) || !apierrors.HasStatusCause(err, metav1.CauseTypeResourceVersionTooLarge) {
			t.Fatalf("a list from %s (the store is at %d): %v; want a Timeout with the ResourceVersionTooLarge cause", ahead, rv, err)
		}
		if s, ok := apierrors.SuggestsClientDelay(err); !ok || s != 1 {
			t.Fatalf("a list from %s: retry after %d s (%v), want 1", ahead, s, ok)
		}
	})

	t.Run("ConflictAndRetry", func(t *testing.T) {
		stale, err := secrets.Get(ctx, "s-0", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		fresh := stale.DeepCopy()
		fresh.Labels["writer"] = "first"
		if _, err := secrets.Update(ctx, fresh, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		stale.Labels["writer"] = "second"
		if _, err := secrets.Update(ctx, stale, metav1.UpdateOptions{}); !apierrors.IsConflict(err) {
			t.Fatalf("update with a stale resourceVersion: %v, want 409 Conflict", err)
		}
		tries := 0
		err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
			tries++
			cur := stale
			if tries > 1 {
				if cur, err = secrets.Get(ctx, "s-0", metav1.GetOptions{}); err != nil {
					return err
				}
			}
			cur.Labels["writer"] = "second"
			_, err := secrets.Update(ctx, cur, metav1.UpdateOptions{})
			return err
		})
		if err != nil || tries != 2 {
			t.Fatalf("RetryOnConflict: %v after %d tries, want success on the second", err, tries)
		}
	})

	t.Run("DryRun", func(t *testing.T) {
		out, err := secrets.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "dry"}},
			metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err != nil {
			t.Fatal(err)
		}
		if out.Name != "dry" || out.Namespace != ns {
			t.Fatalf("dry-run create answered %s/%s", out.Namespace, out.Name)
		}
		if _, err := secrets.Get(ctx, "dry", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Fatalf("dry-run create was stored: %v", err)
		}
	})

	t.Run("GenerateName", func(t *testing.T) {
		out, err := tg.kube.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{
			ObjectMeta: metav1.ObjectMeta{GenerateName: "gen-"}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(out.Name) != len("gen-")+5 || out.Name[:4] != "gen-" {
			t.Fatalf("generated name %q, want gen- and 5 characters", out.Name)
		}
	})

	t.Run("FieldSelector", func(t *testing.T) {
		l, err := secrets.List(ctx, metav1.ListOptions{FieldSelector: "metadata.name=s-3,type=Opaque"})
		if err != nil {
			t.Fatal(err)
		}
		if len(l.Items) != 1 || l.Items[0].Name != "s-3" {
			t.Fatalf("field selector: %d items", len(l.Items))
		}
		_, err = secrets.List(ctx, metav1.ListOptions{FieldSelector: "spec.nothing=x"})
		if !apierrors.IsBadRequest(err) {
			t.Fatalf("unknown field selector: %v, want 400 BadRequest", err)
		}
	})

	t.Run("Patches", func(t *testing.T) {
		out, err := secrets.Patch(ctx, "s-1", types.JSONPatchType,
			[]byte(`[{"op":"add","path":"/metadata/labels/json","value":"yes"}]`), metav1.PatchOptions{})
		if err != nil || out.Labels["json"] != "yes" {
			t.Fatalf("JSON patch: %v %v", err, out)
		}
		out, err = secrets.Patch(ctx, "s-1", types.StrategicMergePatchType,
			[]byte(`{"metadata":{"labels":{"strategic":"yes","json":null}}}`), metav1.PatchOptions{})
		if err != nil || out.Labels["strategic"] != "yes" || out.Labels["json"] != "" {
			t.Fatalf("strategic merge patch: %v %v", err, out)
		}
		_, err = secrets.Patch(ctx, "s-1", types.JSONPatchType,
			[]byte(`[{"op":"test","path":"/metadata/labels/strategic","value":"no"}]`), metav1.PatchOptions{})
		if err == nil {
			t.Fatal("a failing JSON patch test op was applied")
		}
		if !apierrors.IsInvalid(err) && !apierrors.IsConflict(err) && !apierrors.IsBadRequest(err) {
			t.Fatalf("failing JSON patch test op: %v", err)
		}
	})

	t.Run("DeleteCollection", func(t *testing.T) {
		err := secrets.DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{LabelSelector: "batch=1"})
		if err != nil {
			t.Fatal(err)
		}
		l, err := secrets.List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, s := range l.Items {
			names = append(names, s.Name)
		}
		if !slices.Equal(names, []string{"s-0", "s-2", "s-4", "s-6"}) {
			t.Fatalf("after deletecollection batch=1: %v", names)
		}
	})
}

// TestDiscoveryAndRESTMapper: client-go's discovery client (aggregated discovery when the server
// offers it, the legacy per-group documents otherwise) and a RESTMapper over it, as kubectl and
// the dynamic informers use them.
func TestDiscoveryAndRESTMapper(t *testing.T) {
	tg := getTarget(t)
	dc, err := discovery.NewDiscoveryClientForConfig(tg.cfg)
	if err != nil {
		t.Fatal(err)
	}
	_, lists, err := dc.ServerGroupsAndResources()
	if err != nil && !discovery.IsGroupDiscoveryFailedError(err) {
		t.Fatalf("discovery: %v", err)
	}
	type want struct {
		gv, resource string
		namespaced   bool
		verbs        []string
	}
	wants := []want{
		{"v1", "namespaces", false, []string{"create", "delete", "get", "list", "patch", "update", "watch"}},
		{"v1", "serviceaccounts", true, []string{"create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"}},
		{"v1", "secrets", true, []string{"create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"}},
		{"v1", "serviceaccounts/token", true, []string{"create"}},
		{tg.group("events") + "/v1", "events", true, []string{"create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"}},
		{tg.group("certificates") + "/v1", "certificatesigningrequests", false, []string{"create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"}},
		{tg.group("certificates") + "/v1", "certificatesigningrequests/approval", false, []string{"get", "patch", "update"}},
		{tg.group("authentication") + "/v1", "tokenreviews", false, []string{"create"}},
	}
	for _, w := range wants {
		t.Run(w.gv+"/"+w.resource, func(t *testing.T) {
			var found *metav1.APIResource
			for _, l := range lists {
				if l.GroupVersion != w.gv {
					continue
				}
				for i := range l.APIResources {
					if l.APIResources[i].Name == w.resource {
						found = &l.APIResources[i]
					}
				}
			}
			if found == nil {
				t.Fatalf("discovery lacks %s %s", w.gv, w.resource)
			}
			verbs := slices.Sorted(slices.Values(found.Verbs))
			if w.resource == "namespaces" && tg.suffix == "svc.io" && slices.Contains(verbs, "deletecollection") {
				t.Skip("known difference: see FINDINGS.md #3 (namespaces offer deletecollection; kube-apiserver answers 405)")
			}
			if found.Namespaced != w.namespaced || !slices.Equal(verbs, w.verbs) {
				t.Fatalf("namespaced %v verbs %v, want %v %v", found.Namespaced, verbs, w.namespaced, w.verbs)
			}
		})
	}

	// kube-apiserver has no deletecollection for namespaces: DELETE on the collection is 405.
	t.Run("NamespacesDeleteCollection", func(t *testing.T) {
		// client-go's typed Namespaces client has no DeleteCollection, for this reason.
		nsRes := schema.GroupVersionResource{Version: "v1", Resource: "namespaces"}
		err := tg.dyn.Resource(nsRes).DeleteCollection(context.Background(),
			metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}}, metav1.ListOptions{LabelSelector: "interop-none=x"})
		if err == nil && tg.suffix == "svc.io" {
			t.Skip("known difference: see FINDINGS.md #3 (DELETE /api/v1/namespaces answers 200 Success; kube-apiserver answers 405)")
		}
		if !apierrors.IsMethodNotSupported(err) {
			t.Fatalf("DELETE /api/v1/namespaces: %v, want 405 MethodNotAllowed", err)
		}
	})

	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))
	for _, c := range []struct {
		gk    schema.GroupKind
		scope meta.RESTScopeName
		res   string
	}{
		{schema.GroupKind{Kind: "ServiceAccount"}, meta.RESTScopeNameNamespace, "serviceaccounts"},
		{schema.GroupKind{Kind: "Namespace"}, meta.RESTScopeNameRoot, "namespaces"},
		{schema.GroupKind{Group: tg.group("events"), Kind: "Event"}, meta.RESTScopeNameNamespace, "events"},
		{schema.GroupKind{Group: tg.group("certificates"), Kind: "CertificateSigningRequest"}, meta.RESTScopeNameRoot, "certificatesigningrequests"},
	} {
		m, err := mapper.RESTMapping(c.gk, "v1")
		if err != nil {
			t.Errorf("RESTMapping %v: %v", c.gk, err)
			continue
		}
		if m.Resource.Resource != c.res || m.Scope.Name() != c.scope {
			t.Errorf("RESTMapping %v: %v %s, want %s %s", c.gk, m.Resource, m.Scope.Name(), c.res, c.scope)
		}
	}
}
