package clientgo

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	clientfeatures "k8s.io/client-go/features"
	"k8s.io/client-go/tools/cache"
)

// countingLW is a secrets ListerWatcher for one namespace that records how the reflector used it.
type countingLW struct {
	tg *target
	ns string

	mu      sync.Mutex
	lists   int
	watches []metav1.ListOptions
	errs    []error
}

func (c *countingLW) ListWithContext(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
	c.mu.Lock()
	c.lists++
	c.mu.Unlock()
	return c.tg.kube.CoreV1().Secrets(c.ns).List(ctx, o)
}

func (c *countingLW) WatchWithContext(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
	c.mu.Lock()
	c.watches = append(c.watches, o)
	c.mu.Unlock()
	w, err := c.tg.kube.CoreV1().Secrets(c.ns).Watch(ctx, o)
	if err != nil {
		c.mu.Lock()
		c.errs = append(c.errs, err)
		c.mu.Unlock()
	}
	return w, err
}

// List and Watch complete cache.ListerWatcher; the reflector calls the ...WithContext forms.
func (c *countingLW) List(o metav1.ListOptions) (runtime.Object, error) {
	return c.ListWithContext(context.Background(), o)
}

func (c *countingLW) Watch(o metav1.ListOptions) (watch.Interface, error) {
	return c.WatchWithContext(context.Background(), o)
}

// initialSyncs counts full resyncs: plain lists plus streaming lists (sendInitialEvents=true).
func (c *countingLW) initialSyncs() (lists, watchLists int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, o := range c.watches {
		if o.SendInitialEvents != nil && *o.SendInitialEvents {
			watchLists++
		}
	}
	return c.lists, watchLists
}

func (c *countingLW) snapshot() (int, []metav1.ListOptions) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lists, append([]metav1.ListOptions(nil), c.watches...)
}

func startReflector(t *testing.T, ctx context.Context, lw *countingLW) (*cache.Reflector, cache.Store) {
	t.Helper()
	store := cache.NewStore(cache.MetaNamespaceKeyFunc)
	r := cache.NewReflectorWithOptions(lw, &corev1.Secret{}, store, cache.ReflectorOptions{Name: "interop-" + lw.ns})
	go r.RunWithContext(ctx)
	return r, store
}

func secretsState(ctx context.Context, tg *target, ns string) (nameRV, error) {
	l, err := tg.kube.CoreV1().Secrets(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	return listState(l.Items, func(o *corev1.Secret) metav1.Object { return o }), nil
}

func createSecret(t *testing.T, ctx context.Context, tg *target, ns, name string) *corev1.Secret {
	t.Helper()
	s, err := tg.kube.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		StringData: map[string]string{"name": name},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create secret %s/%s: %v", ns, name, err)
	}
	return s
}

// TestReflectorWatchList runs a reflector in WatchList mode (client-go's WatchListClient): its
// initial state comes from one watch with sendInitialEvents=true, ended by a bookmark annotated
// k8s.io/initial-events-end, and never from a list. client-go falls back to a list silently
// when the server refuses, so the test checks that no list was made.
func TestReflectorWatchList(t *testing.T) {
	tg := getTarget(t)
	if !clientfeatures.FeatureGates().Enabled(clientfeatures.WatchListClient) {
		t.Fatal("client-go's WatchListClient feature is off (TestMain turns it on)")
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ns := newNamespace(t, tg, "wl")
	for i := range 5 {
		createSecret(t, ctx, tg, ns, fmt.Sprintf("before-%d", i))
	}
	lw := &countingLW{tg: tg, ns: ns}
	r, store := startReflector(t, ctx, lw)

	eventually(t, 30*time.Second, "initial state streamed", func() error {
		if r.LastSyncResourceVersion() == "" {
			return errors.New("reflector not synced yet")
		}
		want, err := secretsState(ctx, tg, ns)
		if err != nil {
			return err
		}
		return sameState(storeState(store), want)
	})
	lists, watches := lw.snapshot()
	if lists != 0 {
		t.Fatalf("reflector fell back to %d list(s); watch options %+v, watch errors %v", lists, watches, lw.errs)
	}
	first := watches[0]
	if first.SendInitialEvents == nil || !*first.SendInitialEvents || first.ResourceVersionMatch != metav1.ResourceVersionMatchNotOlderThan || !first.AllowWatchBookmarks {
		t.Fatalf("first watch was not a streaming list: %+v", first)
	}

	// Then it watches on: changes after the initial events arrive too.
	createSecret(t, ctx, tg, ns, "after-0")
	if err := tg.kube.CoreV1().Secrets(ns).Delete(ctx, "before-0", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "reflector converges after changes", func() error {
		want, err := secretsState(ctx, tg, ns)
		if err != nil {
			return err
		}
		return sameState(storeState(store), want)
	})
	if lists, _ := lw.snapshot(); lists != 0 {
		t.Fatalf("reflector made %d list(s)", lists)
	}
}

// watchExpired opens a watch from rv and reports whether the server answered 410 Gone
// (as an HTTP status or as the first event, an ERROR carrying a Status with code 410).
// Other errors (429 while a cache warms up, a refused connection) are retried.
func watchExpired(ctx context.Context, tg *target, ns, rv string) (bool, error) {
	var last error
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		w, err := tg.kube.CoreV1().Secrets(ns).Watch(wctx, metav1.ListOptions{ResourceVersion: rv, AllowWatchBookmarks: true})
		if err != nil {
			cancel()
			if apierrors.IsGone(err) || apierrors.IsResourceExpired(err) {
				return true, nil
			}
			last = err
			time.Sleep(500 * time.Millisecond)
			continue
		}
		select {
		case ev, ok := <-w.ResultChan():
			w.Stop()
			cancel()
			if !ok {
				last = errors.New("watch closed without an event")
				time.Sleep(500 * time.Millisecond)
				continue
			}
			if ev.Type == watch.Error {
				st, _ := ev.Object.(*metav1.Status)
				if st != nil && st.Code == 410 {
					return true, nil
				}
				if st != nil && st.Code == 429 {
					last = fmt.Errorf("status %d %s", st.Code, st.Message)
					time.Sleep(500 * time.Millisecond)
					continue
				}
				return false, fmt.Errorf("watch from %s: error event %+v", rv, ev.Object)
			}
			return false, fmt.Errorf("watch from %s: first event %s %T, want 410", rv, ev.Type, ev.Object)
		case <-wctx.Done():
			w.Stop()
			cancel()
			return false, fmt.Errorf("watch from %s: no event in 10 s, want 410", rv)
		}
	}
	return false, fmt.Errorf("watch from %s: no answer: %v", rv, last)
}

// TestReflectorSurvivesRestartAnd410 restarts the server under a running reflector, makes sure
// the reflector's resume point has expired (a watch from it answers 410), and checks that the
// reflector relists and converges. The server must keep its data and port across the restart.
//
// How the 410 is forced: before the restart, writes in another namespace move the revision on
// past the reflector's last resourceVersion without the reflector seeing them. kube-apiserver's
// watch cache starts after a restart at the revision of its initial list, so anything older is
// 410. The gateway runs with a short --watch-cache-history-window (2 s), and the test writes
// and waits past it.
func TestReflectorSurvivesRestartAnd410(t *testing.T) {
	tg := getTarget(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ns := newNamespace(t, tg, "rs")
	other := newNamespace(t, tg, "rs-other")
	for i := range 3 {
		createSecret(t, ctx, tg, ns, fmt.Sprintf("s-%d", i))
	}
	lw := &countingLW{tg: tg, ns: ns}
	r, store := startReflector(t, ctx, lw)
	eventually(t, 30*time.Second, "reflector synced", func() error {
		want, err := secretsState(ctx, tg, ns)
		if err != nil {
			return err
		}
		if r.LastSyncResourceVersion() == "" {
			return errors.New("not synced")
		}
		return sameState(storeState(store), want)
	})
	resumeRV := r.LastSyncResourceVersion()
	for i := range 5 {
		createSecret(t, ctx, tg, other, fmt.Sprintf("before-restart-%d", i))
	}

	tg.restartServer(t)

	time.Sleep(3 * time.Second)
	for i := range 5 {
		createSecret(t, ctx, tg, other, fmt.Sprintf("after-restart-%d", i))
	}
	expired, err := watchExpired(ctx, tg, ns, resumeRV)
	if err != nil {
		t.Fatal(err)
	}
	if !expired {
		t.Fatalf("a watch from the reflector's resourceVersion %s did not answer 410", resumeRV)
	}

	// Changes the reflector has not seen: it must relist to catch up.
	core := tg.kube.CoreV1()
	createSecret(t, ctx, tg, ns, "s-new")
	s, err := core.Secrets(ns).Get(ctx, "s-1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s.Labels = map[string]string{"updated": "yes"}
	if _, err := core.Secrets(ns).Update(ctx, s, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := core.Secrets(ns).Delete(ctx, "s-2", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 60*time.Second, "reflector converges after restart and 410", func() error {
		want, err := secretsState(ctx, tg, ns)
		if err != nil {
			return err
		}
		return sameState(storeState(store), want)
	})
	lists, watchLists := lw.initialSyncs()
	if lists+watchLists < 2 {
		t.Fatalf("reflector did not relist: %d list(s), %d streaming list(s)", lists, watchLists)
	}
	t.Logf("%d list(s), %d streaming list(s); resumed from %s", lists, watchLists, resumeRV)
}
