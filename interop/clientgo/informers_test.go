package clientgo

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
)

// nameRV maps namespace/name to resourceVersion: what "converged" compares.
type nameRV map[string]string

func (m nameRV) String() string {
	keys := slices.Sorted(maps.Keys(m))
	s := "{"
	for i, k := range keys {
		if i > 0 {
			s += " "
		}
		s += k + "@" + m[k]
	}
	return s + "}"
}

func storeState(store cache.Store) nameRV {
	out := nameRV{}
	for _, o := range store.List() {
		m, err := metaOf(o)
		if err != nil {
			continue
		}
		out[m.GetNamespace()+"/"+m.GetName()] = m.GetResourceVersion()
	}
	return out
}

func metaOf(o any) (metav1.Object, error) {
	if d, ok := o.(cache.DeletedFinalStateUnknown); ok {
		o = d.Obj
	}
	m, ok := o.(metav1.Object)
	if !ok {
		return nil, fmt.Errorf("%T has no ObjectMeta", o)
	}
	return m, nil
}

func listState[T any](items []T, meta func(*T) metav1.Object) nameRV {
	out := nameRV{}
	for i := range items {
		m := meta(&items[i])
		out[m.GetNamespace()+"/"+m.GetName()] = m.GetResourceVersion()
	}
	return out
}

func sameState(a, b nameRV) error {
	if maps.Equal(a, b) {
		return nil
	}
	return fmt.Errorf("informer %v, server %v", a, b)
}

// TestSharedInformersConverge runs shared informers on namespaces, serviceaccounts and secrets
// and checks that after creates, updates and deletes each informer's store equals a fresh list.
func TestSharedInformersConverge(t *testing.T) {
	tg := getTarget(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	run := randSuffix()
	ns := newNamespace(t, tg, "inf")
	runLabel := labels.Set{"interop-run": run}.String()

	// Namespaces: cluster-scoped, so the informer selects this run's namespaces by label.
	nsFactory := informers.NewSharedInformerFactoryWithOptions(tg.kube, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = runLabel }))
	nsInformer := nsFactory.Core().V1().Namespaces().Informer()
	// ServiceAccounts and Secrets: one namespace.
	factory := informers.NewSharedInformerFactoryWithOptions(tg.kube, 0, informers.WithNamespace(ns))
	saInformer := factory.Core().V1().ServiceAccounts().Informer()
	secretInformer := factory.Core().V1().Secrets().Informer()
	var handled atomic.Int64
	for _, inf := range []cache.SharedIndexInformer{nsInformer, saInformer, secretInformer} {
		_, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    func(any) { handled.Add(1) },
			UpdateFunc: func(any, any) { handled.Add(1) },
			DeleteFunc: func(any) { handled.Add(1) },
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	nsFactory.Start(ctx.Done())
	factory.Start(ctx.Done())
	defer func() {
		// Shutdown waits for the informers, which stop when the context is cancelled.
		cancel()
		nsFactory.Shutdown()
		factory.Shutdown()
	}()
	for typ, ok := range nsFactory.WaitForCacheSync(ctx.Done()) {
		if !ok {
			t.Fatalf("%v did not sync", typ)
		}
	}
	for typ, ok := range factory.WaitForCacheSync(ctx.Done()) {
		if !ok {
			t.Fatalf("%v did not sync", typ)
		}
	}

	core := tg.kube.CoreV1()
	// Creates.
	for i := range 3 {
		_, err := core.Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{
			Name: fmt.Sprintf("inf-%s-%d", run, i), Labels: map[string]string{"interop-run": run, "interop": "true"},
		}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		_, err = core.ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{
			Name: fmt.Sprintf("sa-%d", i)}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		_, err = core.Secrets(ns).Create(ctx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("secret-%d", i)},
			StringData: map[string]string{"k": fmt.Sprint(i)},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		for i := range 3 {
			_ = core.Namespaces().Delete(context.Background(), fmt.Sprintf("inf-%s-%d", run, i), metav1.DeleteOptions{})
		}
	})
	// Updates: a label on each, a data change on one secret (PUT), a merge patch on one SA.
	for i := range 3 {
		n, err := core.Namespaces().Get(ctx, fmt.Sprintf("inf-%s-%d", run, i), metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		n.Labels["updated"] = "yes"
		if _, err := core.Namespaces().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	s, err := core.Secrets(ns).Get(ctx, "secret-1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s.Data["k"] = []byte("changed")
	if _, err := core.Secrets(ns).Update(ctx, s, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := core.ServiceAccounts(ns).Patch(ctx, "sa-1", types.MergePatchType,
		[]byte(`{"metadata":{"labels":{"updated":"yes"}}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	// Deletes. A namespace delete only marks it Terminating on kube-apiserver without a
	// controller-manager; the gateway finishes it. Either way the informer must match the server.
	if err := core.Namespaces().Delete(ctx, fmt.Sprintf("inf-%s-2", run), metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := core.ServiceAccounts(ns).Delete(ctx, "sa-2", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := core.Secrets(ns).Delete(ctx, "secret-2", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}

	eventually(t, 30*time.Second, "namespace informer converges", func() error {
		l, err := core.Namespaces().List(ctx, metav1.ListOptions{LabelSelector: runLabel})
		if err != nil {
			return err
		}
		return sameState(storeState(nsInformer.GetStore()), listState(l.Items, func(o *corev1.Namespace) metav1.Object { return o }))
	})
	eventually(t, 30*time.Second, "serviceaccount informer converges", func() error {
		l, err := core.ServiceAccounts(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		return sameState(storeState(saInformer.GetStore()), listState(l.Items, func(o *corev1.ServiceAccount) metav1.Object { return o }))
	})
	eventually(t, 30*time.Second, "secret informer converges", func() error {
		l, err := core.Secrets(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		return sameState(storeState(secretInformer.GetStore()), listState(l.Items, func(o *corev1.Secret) metav1.Object { return o }))
	})
	// The informer's copy carries the update, not just the right resourceVersion.
	obj, ok, err := secretInformer.GetStore().GetByKey(ns + "/secret-1")
	if err != nil || !ok {
		t.Fatalf("secret-1 not in the informer: %v", err)
	}
	if got := string(obj.(*corev1.Secret).Data["k"]); got != "changed" {
		t.Fatalf("informer's secret-1 data k = %q, want %q", got, "changed")
	}
	if _, ok, _ := saInformer.GetStore().GetByKey(ns + "/sa-2"); ok {
		t.Fatal("deleted sa-2 still in the informer")
	}
	if handled.Load() == 0 {
		t.Fatal("no event handler was called")
	}
}

// TestInformerAllNamespacesLabelSelector: an informer over every namespace with a label
// selector (a cluster-wide watch, /api/v1/secrets?labelSelector=...). An object that stops
// matching must leave the informer (the watch sends DELETED for it), one that starts matching
// must enter it (ADDED).
func TestInformerAllNamespacesLabelSelector(t *testing.T) {
	tg := getTarget(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	run := randSuffix()
	nsA := newNamespace(t, tg, "sel-a")
	nsB := newNamespace(t, tg, "sel-b")
	selector := labels.Set{"interop-sel": run}.String()
	factory := informers.NewSharedInformerFactoryWithOptions(tg.kube, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = selector }))
	inf := factory.Core().V1().Secrets().Informer()
	var deletes atomic.Int64
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{DeleteFunc: func(any) { deletes.Add(1) }}); err != nil {
		t.Fatal(err)
	}
	factory.Start(ctx.Done())
	defer func() {
		cancel()
		factory.Shutdown()
	}()
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		t.Fatal("informer did not sync")
	}
	core := tg.kube.CoreV1()
	for _, ns := range []string{nsA, nsB} {
		for _, name := range []string{"in", "out"} {
			l := map[string]string{"interop-sel": run}
			if name == "out" {
				l = map[string]string{"interop-sel": "other"}
			}
			if _, err := core.Secrets(ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: l}}, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	// nsA/in leaves the selector; nsB/out enters it.
	if _, err := core.Secrets(nsA).Patch(ctx, "in", types.MergePatchType, []byte(`{"metadata":{"labels":{"interop-sel":"gone"}}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := core.Secrets(nsB).Patch(ctx, "out", types.MergePatchType, []byte(`{"metadata":{"labels":{"interop-sel":"`+run+`"}}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "selector informer converges", func() error {
		l, err := core.Secrets("").List(ctx, metav1.ListOptions{LabelSelector: selector})
		if err != nil {
			return err
		}
		want := listState(l.Items, func(o *corev1.Secret) metav1.Object { return o })
		if len(want) != 2 {
			return fmt.Errorf("server lists %v, want nsB/in and nsB/out", want)
		}
		return sameState(storeState(inf.GetStore()), want)
	})
	if deletes.Load() != 1 {
		t.Fatalf("%d delete notifications, want 1 (nsA/in left the selector)", deletes.Load())
	}
}
