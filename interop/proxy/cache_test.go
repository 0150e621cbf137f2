package proxy

import (
	"context"
	"fmt"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	clientfeatures "k8s.io/client-go/features"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"sigs.k8s.io/yaml"
)

// The tests of proxy mode's caches: every resource upstream discovery offers is held in a
// watch cache of the proxy, and the lists and watches it can answer exactly are served from
// there. Each test reads the proxy's svc_proxy_cache_reads_total before and after, so it fails
// when the reads it makes are passed through instead of served from the cache.

// sample is one line of the Prometheus text format.
type sample struct {
	name   string
	labels map[string]string
	value  float64
}

// proxyMetrics reads the proxy's /metrics as the admin.
func proxyMetrics(t *testing.T, e *env) []sample {
	t.Helper()
	body, err := e.clients(t, e.proxy).Discovery().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx(t))
	if err != nil {
		t.Fatalf("reading the proxy's /metrics: %v", err)
	}
	samples, err := parseMetrics(string(body))
	if err != nil {
		t.Fatalf("the proxy's /metrics: %v", err)
	}
	return samples
}

func parseMetrics(text string) ([]sample, error) {
	var out []sample
	for _, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		s := sample{labels: map[string]string{}}
		i := strings.IndexAny(line, "{ ")
		if i < 0 {
			return nil, fmt.Errorf("no value: %q", line)
		}
		s.name, line = line[:i], line[i:]
		if line[0] == '{' {
			line = line[1:]
			for {
				line = strings.TrimLeft(line, ", ")
				if strings.HasPrefix(line, "}") {
					line = line[1:]
					break
				}
				eq := strings.Index(line, "=\"")
				if eq < 0 {
					return nil, fmt.Errorf("bad labels in %q", line)
				}
				key := line[:eq]
				line = line[eq+2:]
				var val strings.Builder
				j := 0
				for ; j < len(line) && line[j] != '"'; j++ {
					if line[j] == '\\' && j+1 < len(line) {
						j++
						switch line[j] {
						case 'n':
							val.WriteByte('\n')
						default:
							val.WriteByte(line[j])
						}
						continue
					}
					val.WriteByte(line[j])
				}
				if j == len(line) {
					return nil, fmt.Errorf("unterminated label value in %q", line)
				}
				s.labels[key] = val.String()
				line = line[j+1:]
			}
		}
		fields := strings.Fields(line)
		if len(fields) == 0 {
			return nil, fmt.Errorf("no value for %s", s.name)
		}
		v, err := strconv.ParseFloat(fields[0], 64)
		if err != nil {
			return nil, fmt.Errorf("%s: %v", s.name, err)
		}
		s.value = v
		out = append(out, s)
	}
	return out, nil
}

// sum adds the values of the series named name whose labels include match; found says whether
// there was one.
func sum(samples []sample, name string, match map[string]string) (total float64, found bool) {
	for _, s := range samples {
		if s.name != name {
			continue
		}
		ok := true
		for k, v := range match {
			if s.labels[k] != v {
				ok = false
				break
			}
		}
		if ok {
			total += s.value
			found = true
		}
	}
	return total, found
}

// cacheReads is how many lists or watches (verb) of a resource the proxy served from its cache.
func cacheReads(t *testing.T, e *env, group, resource, verb string) float64 {
	t.Helper()
	n, _ := sum(proxyMetrics(t, e), "svc_proxy_cache_reads_total", map[string]string{"group": group, "resource": resource, "verb": verb})
	return n
}

// noWatchersLeft waits until the proxy's cache of a core resource has no watcher: the tests'
// watches, stopped, are gone there too.
func noWatchersLeft(t *testing.T, e *env, resource string) {
	t.Helper()
	eventually(t, 10*time.Second, "the stopped watches of "+resource+" leave the proxy's cache", func() error {
		if n, _ := sum(proxyMetrics(t, e), "svc_proxy_cache_watchers", map[string]string{"group": "", "resource": resource}); n != 0 {
			return fmt.Errorf("svc_proxy_cache_watchers{resource=%q} is %v", resource, n)
		}
		return nil
	})
}

// isCached says whether the proxy holds a cache of a resource (its objects gauge is there).
func isCached(t *testing.T, e *env, group, resource string) bool {
	t.Helper()
	_, found := sum(proxyMetrics(t, e), "svc_proxy_cache_objects", map[string]string{"group": group, "resource": resource})
	return found
}

// eventually calls f until it returns nil, and fails the test with its last error after timeout.
func eventually(t *testing.T, timeout time.Duration, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: still not so after %s: %v", what, timeout, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// withWatchListClient sets client-go's WatchListClient feature for the rest of the test. On
// (its default), informers start with a watch with sendInitialEvents=true and no
// resourceVersion, a consistent read the proxy passes through; off, with a list
// resourceVersion=0 and a watch from its version, which the proxy serves from its cache.
func withWatchListClient(t *testing.T, on bool) {
	gates.mu.Lock()
	gates.watchList = &on
	gates.mu.Unlock()
	t.Cleanup(func() {
		gates.mu.Lock()
		gates.watchList = nil
		gates.mu.Unlock()
	})
}

// gates are client-go's feature gates with WatchListClient switchable by the tests. They are
// put in place before client-go reads any (replaced later, client-go logs an error).
var gates = &switchableGates{Gates: clientfeatures.FeatureGates()}

func init() { clientfeatures.ReplaceFeatureGates(gates) }

type switchableGates struct {
	clientfeatures.Gates
	mu        sync.Mutex
	watchList *bool
}

func (g *switchableGates) Enabled(key clientfeatures.Feature) bool {
	g.mu.Lock()
	on := g.watchList
	g.mu.Unlock()
	if key == clientfeatures.WatchListClient && on != nil {
		return *on
	}
	return g.Gates.Enabled(key)
}

// preferProtobuf is cfg asking for protobuf first and accepting JSON, as client-go's
// generated clients do in controllers (kube-controller-manager, kubelet): the proxy's cache
// answers it in JSON.
func preferProtobuf(cfg *rest.Config) *rest.Config {
	c := rest.CopyConfig(cfg)
	c.ContentType = "application/vnd.kubernetes.protobuf"
	c.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	return c
}

// seen records what an informer's event handlers were told: each object's last
// resourceVersion, and the deleted ones.
type seen struct {
	mu      sync.Mutex
	rv      map[string]string
	deleted map[string]bool
	events  []string
}

func newSeen() *seen { return &seen{rv: map[string]string{}, deleted: map[string]bool{}} }

func (s *seen) handler() cache.ResourceEventHandler {
	record := func(kind string, obj any) {
		if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = d.Obj
		}
		m, err := meta.Accessor(obj)
		if err != nil {
			return
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		s.events = append(s.events, kind+" "+m.GetName()+"@"+m.GetResourceVersion())
		if kind == "delete" {
			s.deleted[m.GetName()] = true
			delete(s.rv, m.GetName())
			return
		}
		delete(s.deleted, m.GetName())
		s.rv[m.GetName()] = m.GetResourceVersion()
	}
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { record("add", obj) },
		UpdateFunc: func(_, obj any) { record("update", obj) },
		DeleteFunc: func(obj any) { record("delete", obj) },
	}
}

// at is nil once the handlers were told of name at resourceVersion rv.
func (s *seen) at(name, rv string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.rv[name] != rv {
		return fmt.Errorf("%s: the handlers saw resourceVersion %q, want %q (events %v)", name, s.rv[name], rv, s.events)
	}
	return nil
}

func (s *seen) gone(name string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.deleted[name] {
		return fmt.Errorf("%s: no delete seen (events %v)", name, s.events)
	}
	return nil
}

// inStore is nil once an informer's store holds name at rv, or, rv empty, does not hold it.
func inStore(store cache.Store, ns, name, rv string) error {
	obj, exists, err := store.GetByKey(ns + "/" + name)
	if err != nil {
		return err
	}
	if rv == "" {
		if exists {
			return fmt.Errorf("%s is still in the informer's store", name)
		}
		return nil
	}
	if !exists {
		return fmt.Errorf("%s is not in the informer's store", name)
	}
	m, err := meta.Accessor(obj)
	if err != nil {
		return err
	}
	if m.GetResourceVersion() != rv {
		return fmt.Errorf("%s in the informer's store at resourceVersion %s, want %s", name, m.GetResourceVersion(), rv)
	}
	return nil
}

func pauseContainer() []corev1.Container {
	return []corev1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10"}}
}

func TestCacheServesInformers(t *testing.T) {
	e := getEnv(t)
	for _, mode := range []struct {
		name      string
		watchList bool
	}{{"ListAndWatch", false}, {"WatchList", true}} {
		t.Run(mode.name, func(t *testing.T) {
			withWatchListClient(t, mode.watchList)
			ns := namespace(t, e, "cache-informers")
			direct := e.clients(t, e.upstream)
			proxy := e.clients(t, preferProtobuf(e.proxy))
			before := map[string]float64{}
			for _, r := range []string{"configmaps", "pods"} {
				for _, verb := range []string{"list", "watch"} {
					before[r+" "+verb] = cacheReads(t, e, "", r, verb)
				}
			}

			factory := informers.NewSharedInformerFactoryWithOptions(proxy, 0, informers.WithNamespace(ns))
			cms, pods := factory.Core().V1().ConfigMaps(), factory.Core().V1().Pods()
			cmSeen, podSeen := newSeen(), newSeen()
			if _, err := cms.Informer().AddEventHandler(cmSeen.handler()); err != nil {
				t.Fatal(err)
			}
			if _, err := pods.Informer().AddEventHandler(podSeen.handler()); err != nil {
				t.Fatal(err)
			}
			// One object of each before the informers start: their first list has it.
			first, err := direct.CoreV1().ConfigMaps(ns).Create(ctx(t), &corev1.ConfigMap{
				ObjectMeta: metav1.ObjectMeta{Name: "before"}, Data: map[string]string{"k": "0"},
			}, metav1.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			stop := make(chan struct{})
			defer func() {
				close(stop)
				factory.Shutdown()
			}()
			factory.Start(stop)
			syncCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			for typ, ok := range factory.WaitForCacheSync(syncCtx.Done()) {
				if !ok {
					t.Fatalf("the %v informer through the proxy did not sync", typ)
				}
			}
			eventually(t, 20*time.Second, "the configmap made before the informer", func() error {
				return cmSeen.at("before", first.ResourceVersion)
			})

			// Changes upstream reach the informers through the proxy, each at its version.
			cm, err := direct.CoreV1().ConfigMaps(ns).Create(ctx(t), &corev1.ConfigMap{
				ObjectMeta: metav1.ObjectMeta{Name: "cm"}, Data: map[string]string{"k": "1"},
			}, metav1.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			pod, err := direct.CoreV1().Pods(ns).Create(ctx(t), &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Name: "p", Labels: map[string]string{"v": "1"}},
				Spec:       corev1.PodSpec{Containers: pauseContainer()},
			}, metav1.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			eventually(t, 20*time.Second, "the created configmap", func() error {
				if err := cmSeen.at("cm", cm.ResourceVersion); err != nil {
					return err
				}
				return inStore(cms.Informer().GetStore(), ns, "cm", cm.ResourceVersion)
			})
			eventually(t, 20*time.Second, "the created pod", func() error {
				if err := podSeen.at("p", pod.ResourceVersion); err != nil {
					return err
				}
				return inStore(pods.Informer().GetStore(), ns, "p", pod.ResourceVersion)
			})

			cm.Data["k"] = "2"
			if cm, err = direct.CoreV1().ConfigMaps(ns).Update(ctx(t), cm, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			pod.Labels["v"] = "2"
			if pod, err = direct.CoreV1().Pods(ns).Update(ctx(t), pod, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			eventually(t, 20*time.Second, "the updated configmap", func() error {
				if err := cmSeen.at("cm", cm.ResourceVersion); err != nil {
					return err
				}
				got, err := cms.Lister().ConfigMaps(ns).Get("cm")
				if err != nil {
					return err
				}
				if got.Data["k"] != "2" {
					return fmt.Errorf("the lister has data %v", got.Data)
				}
				return nil
			})
			eventually(t, 20*time.Second, "the updated pod", func() error {
				if err := podSeen.at("p", pod.ResourceVersion); err != nil {
					return err
				}
				got, err := pods.Lister().Pods(ns).Get("p")
				if err != nil {
					return err
				}
				if got.Labels["v"] != "2" {
					return fmt.Errorf("the lister has labels %v", got.Labels)
				}
				return nil
			})

			if err := direct.CoreV1().ConfigMaps(ns).Delete(ctx(t), "cm", metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
			if err := direct.CoreV1().Pods(ns).Delete(ctx(t), "p", metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
				t.Fatal(err)
			}
			eventually(t, 20*time.Second, "the deleted configmap", func() error {
				if err := cmSeen.gone("cm"); err != nil {
					return err
				}
				return inStore(cms.Informer().GetStore(), ns, "cm", "")
			})
			eventually(t, 20*time.Second, "the deleted pod", func() error {
				if err := podSeen.gone("p"); err != nil {
					return err
				}
				return inStore(pods.Informer().GetStore(), ns, "p", "")
			})
			if got := cms.Informer().GetStore().ListKeys(); !reflect.DeepEqual(got, []string{ns + "/before"}) {
				t.Errorf("the configmap informer's store at the end: %v", got)
			}

			for key, n := range before {
				r, verb, _ := strings.Cut(key, " ")
				after := cacheReads(t, e, "", r, verb)
				t.Logf("%s %s served from the cache: %v", verb, r, after-n)
				// A WatchList informer starts with a watch (sendInitialEvents, no
				// resourceVersion), which the proxy serves once its cache is proven fresh;
				// it lists only if the streaming list fails.
				if (!mode.watchList || verb == "watch") && after <= n {
					t.Errorf("the informer's %s of %s was not served from the proxy's cache (svc_proxy_cache_reads_total stayed at %v)", verb, r, n)
				}
			}
		})
	}
}

// widgetCRD is a namespaced CRD of widgets in group.
func widgetCRD(group string) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
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
}

var crdsResource = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

func TestCacheCustomResource(t *testing.T) {
	e := getEnv(t)
	withWatchListClient(t, false)
	ns := namespace(t, e, "cache-crd")
	group := fmt.Sprintf("c%d.cache.example.com", time.Now().UnixNano())
	directDyn, err := dynamic.NewForConfig(e.upstream)
	if err != nil {
		t.Fatal(err)
	}
	proxyDyn, err := dynamic.NewForConfig(e.proxy)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := directDyn.Resource(crdsResource).Create(ctx(t), widgetCRD(group), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	crdDeleted := false
	t.Cleanup(func() {
		if !crdDeleted {
			_ = directDyn.Resource(crdsResource).Delete(context.Background(), "widgets."+group, metav1.DeleteOptions{})
		}
	})
	// The proxy reads discovery again when a CRD changes: the new resource gets its cache.
	start := time.Now()
	eventually(t, 45*time.Second, "the proxy caches widgets."+group, func() error {
		if !isCached(t, e, group, "widgets") {
			return fmt.Errorf("no svc_proxy_cache_objects{group=%q}", group)
		}
		return nil
	})
	t.Logf("widgets.%s cached %s after its CRD was created", group, time.Since(start).Round(time.Millisecond))

	widgets := schema.GroupVersionResource{Group: group, Version: "v1", Resource: "widgets"}
	factory := dynamicinformer.NewFilteredDynamicSharedInformerFactory(proxyDyn, 0, ns, nil)
	informer := factory.ForResource(widgets).Informer()
	seenW := newSeen()
	if _, err := informer.AddEventHandler(seenW.handler()); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	stopped := false
	stopInformer := func() {
		if !stopped {
			stopped = true
			close(stop)
			factory.Shutdown()
		}
	}
	defer stopInformer()
	factory.Start(stop)
	syncCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if !cache.WaitForCacheSync(syncCtx.Done(), informer.HasSynced) {
		t.Fatal("the widget informer through the proxy did not sync")
	}

	w := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": group + "/v1",
		"kind":       "Widget",
		"metadata":   map[string]any{"name": "w1"},
		"spec":       map[string]any{"size": int64(1)},
	}}
	created, err := directDyn.Resource(widgets).Namespace(ns).Create(ctx(t), w, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, "the created widget", func() error {
		if err := seenW.at("w1", created.GetResourceVersion()); err != nil {
			return err
		}
		return inStore(informer.GetStore(), ns, "w1", created.GetResourceVersion())
	})
	if err := unstructured.SetNestedField(created.Object, int64(2), "spec", "size"); err != nil {
		t.Fatal(err)
	}
	updated, err := directDyn.Resource(widgets).Namespace(ns).Update(ctx(t), created, metav1.UpdateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, "the updated widget", func() error {
		if err := seenW.at("w1", updated.GetResourceVersion()); err != nil {
			return err
		}
		obj, _, err := informer.GetStore().GetByKey(ns + "/w1")
		if err != nil || obj == nil {
			return fmt.Errorf("w1 not in the store: %v", err)
		}
		if size, _, _ := unstructured.NestedInt64(obj.(*unstructured.Unstructured).Object, "spec", "size"); size != 2 {
			return fmt.Errorf("w1 in the store has size %d", size)
		}
		return nil
	})
	if err := directDyn.Resource(widgets).Namespace(ns).Delete(ctx(t), "w1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, "the deleted widget", func() error {
		if err := seenW.gone("w1"); err != nil {
			return err
		}
		return inStore(informer.GetStore(), ns, "w1", "")
	})
	for _, verb := range []string{"list", "watch"} {
		if n := cacheReads(t, e, group, "widgets", verb); n < 1 {
			t.Errorf("the widget informer's %s was not served from the proxy's cache", verb)
		}
	}
	stopInformer()

	// A configmap watch served from the cache goes on when another resource's cache goes away.
	proxy := e.clients(t, e.proxy)
	direct := e.clients(t, e.upstream)
	watchesBefore := cacheReads(t, e, "", "configmaps", "watch")
	list, err := proxy.CoreV1().ConfigMaps(ns).List(ctx(t), metav1.ListOptions{ResourceVersion: "0"})
	if err != nil {
		t.Fatal(err)
	}
	cmWatch, err := proxy.CoreV1().ConfigMaps(ns).Watch(ctx(t), metav1.ListOptions{ResourceVersion: list.ResourceVersion})
	if err != nil {
		t.Fatal(err)
	}
	defer cmWatch.Stop()
	if n := cacheReads(t, e, "", "configmaps", "watch"); n <= watchesBefore {
		t.Errorf("the configmap watch from %s was not served from the proxy's cache", list.ResourceVersion)
	}
	if n, _ := sum(proxyMetrics(t, e), "svc_proxy_cache_watchers", map[string]string{"group": "", "resource": "configmaps"}); n < 1 {
		t.Errorf("svc_proxy_cache_watchers{resource=configmaps} is %v with a watch open", n)
	}
	if err := directDyn.Resource(crdsResource).Delete(ctx(t), "widgets."+group, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	crdDeleted = true
	start = time.Now()
	eventually(t, 45*time.Second, "the proxy drops widgets."+group, func() error {
		if isCached(t, e, group, "widgets") {
			return fmt.Errorf("svc_proxy_cache_objects{group=%q} is still there", group)
		}
		return nil
	})
	t.Logf("widgets.%s dropped %s after its CRD was deleted", group, time.Since(start).Round(time.Millisecond))
	if _, found := sum(proxyMetrics(t, e), "svc_proxy_cache_resource_version", map[string]string{"group": group}); found {
		t.Errorf("svc_proxy_cache_resource_version still has group %s", group)
	}
	after, err := direct.CoreV1().ConfigMaps(ns).Create(ctx(t), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "after"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ev := nextEvent(t, cmWatch, 20*time.Second, "the configmap watch after the CRD's deletion")
	if c, _ := ev.Object.(*corev1.ConfigMap); ev.Type != watch.Added || c == nil || c.Name != "after" || c.ResourceVersion != after.ResourceVersion {
		t.Errorf("the configmap watch after the CRD's deletion: %s %s, want ADDED after@%s", ev.Type, describe(ev.Object), after.ResourceVersion)
	}
}

// nextEvent is the watch's next event other than a bookmark; the test fails when it ends or
// none comes within timeout.
func nextEvent(t *testing.T, w watch.Interface, timeout time.Duration, what string) watch.Event {
	t.Helper()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	for {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				t.Fatalf("%s: the watch ended", what)
			}
			if ev.Type == watch.Bookmark {
				continue
			}
			if ev.Type == watch.Error {
				t.Fatalf("%s: an ERROR event: %s", what, describe(ev.Object))
			}
			return ev
		case <-timer.C:
			t.Fatalf("%s: no event within %s", what, timeout)
		}
	}
}

func describe(obj any) string {
	if s, ok := obj.(*metav1.Status); ok {
		return fmt.Sprintf("Status %d %s %q", s.Code, s.Reason, s.Message)
	}
	m, err := meta.Accessor(obj)
	if err != nil {
		return fmt.Sprintf("%T", obj)
	}
	return fmt.Sprintf("%T %s@%s", obj, m.GetName(), m.GetResourceVersion())
}

func TestCacheRBAC(t *testing.T) {
	e := getEnv(t)
	a := namespace(t, e, "cache-rbac-a")
	b := namespace(t, e, "cache-rbac-b")
	direct := e.clients(t, e.upstream)
	for _, ns := range []string{a, b} {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "cm", Labels: map[string]string{"a": "b"}}}
		if _, err := direct.CoreV1().ConfigMaps(ns).Create(ctx(t), cm, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// A ClusterRole bound in one namespace. (The aggregated `view` stays empty without a
	// controller-manager upstream, so the rules are spelled out.)
	user := fmt.Sprintf("cache-user-%d", time.Now().UnixNano())
	role := &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: user + "-view"},
		Rules: []rbacv1.PolicyRule{{
			APIGroups: []string{""}, Resources: []string{"configmaps", "pods"}, Verbs: []string{"get", "list", "watch"},
		}},
	}
	if _, err := direct.RbacV1().ClusterRoles().Create(ctx(t), role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = direct.RbacV1().ClusterRoles().Delete(context.Background(), role.Name, metav1.DeleteOptions{})
	})
	binding := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "view"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: role.Name},
		Subjects:   []rbacv1.Subject{{APIGroup: "rbac.authorization.k8s.io", Kind: "User", Name: user}},
	}
	if _, err := direct.RbacV1().RoleBindings(a).Create(ctx(t), binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// In a third namespace the user may list but not watch.
	c := namespace(t, e, "cache-rbac-c")
	listOnly := &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: user + "-list"},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"list"}}},
	}
	if _, err := direct.RbacV1().ClusterRoles().Create(ctx(t), listOnly, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = direct.RbacV1().ClusterRoles().Delete(context.Background(), listOnly.Name, metav1.DeleteOptions{})
	})
	listBinding := binding.DeepCopy()
	listBinding.RoleRef.Name = listOnly.Name
	if _, err := direct.RbacV1().RoleBindings(c).Create(ctx(t), listBinding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	userDirect := e.userConfig(t, user)
	asUser, asUserProxied := e.clients(t, userDirect), e.clients(t, e.throughProxy(userDirect))
	eventually(t, 10*time.Second, user+" lists configmaps upstream", func() error {
		_, err := asUser.CoreV1().ConfigMaps(a).List(ctx(t), metav1.ListOptions{})
		return err
	})

	for _, selector := range []string{"", "a=b"} {
		opts := metav1.ListOptions{ResourceVersion: "0", LabelSelector: selector}
		before := cacheReads(t, e, "", "configmaps", "list")
		list, err := asUserProxied.CoreV1().ConfigMaps(a).List(ctx(t), opts)
		if err != nil {
			t.Errorf("%s lists configmaps (%q) in %s through the proxy: %v", user, selector, a, err)
		} else if len(list.Items) != 1 || list.Items[0].Name != "cm" {
			t.Errorf("%s lists configmaps (%q) in %s through the proxy: %d items", user, selector, a, len(list.Items))
		}
		if n := cacheReads(t, e, "", "configmaps", "list"); n <= before {
			t.Errorf("the list (%q) in %s was not served from the proxy's cache", selector, a)
		}
		_, dErr := asUser.CoreV1().ConfigMaps(b).List(ctx(t), opts)
		_, pErr := asUserProxied.CoreV1().ConfigMaps(b).List(ctx(t), opts)
		sameRefusal(t, fmt.Sprintf("%s lists configmaps (resourceVersion=0, labelSelector %q) in %s", user, selector, b), dErr, pErr)

		wopts := metav1.ListOptions{ResourceVersion: "0", LabelSelector: selector}
		dw, dErr := asUser.CoreV1().ConfigMaps(b).Watch(ctx(t), wopts)
		pw, pErr := asUserProxied.CoreV1().ConfigMaps(b).Watch(ctx(t), wopts)
		for _, w := range []watch.Interface{dw, pw} {
			if w != nil {
				w.Stop()
			}
		}
		sameRefusal(t, fmt.Sprintf("%s watches configmaps (resourceVersion=0, labelSelector %q) in %s", user, selector, b), dErr, pErr)
	}

	eventually(t, 10*time.Second, user+" lists configmaps in "+c+" upstream", func() error {
		_, err := asUser.CoreV1().ConfigMaps(c).List(ctx(t), metav1.ListOptions{})
		return err
	})
	before := cacheReads(t, e, "", "configmaps", "list")
	if _, err := asUserProxied.CoreV1().ConfigMaps(c).List(ctx(t), metav1.ListOptions{ResourceVersion: "0"}); err != nil {
		t.Errorf("%s lists configmaps in %s through the proxy: %v", user, c, err)
	}
	if n := cacheReads(t, e, "", "configmaps", "list"); n <= before {
		t.Errorf("the list in %s was not served from the proxy's cache", c)
	}
	for _, opts := range []metav1.ListOptions{{ResourceVersion: "0"}, {ResourceVersion: "0", LabelSelector: "a=b"}} {
		dw, dErr := asUser.CoreV1().ConfigMaps(c).Watch(ctx(t), opts)
		pw, pErr := asUserProxied.CoreV1().ConfigMaps(c).Watch(ctx(t), opts)
		for _, w := range []watch.Interface{dw, pw} {
			if w != nil {
				w.Stop()
			}
		}
		sameRefusal(t, fmt.Sprintf("%s, who may list but not watch, watches configmaps (%q) in %s", user, opts.LabelSelector, c), dErr, pErr)
	}

	// The allowed watch is served from the cache, initial events first.
	before = cacheReads(t, e, "", "configmaps", "watch")
	w, err := asUserProxied.CoreV1().ConfigMaps(a).Watch(ctx(t), metav1.ListOptions{ResourceVersion: "0"})
	if err != nil {
		t.Fatalf("%s watches configmaps in %s through the proxy: %v", user, a, err)
	}
	ev := nextEvent(t, w, 20*time.Second, user+"'s watch in "+a)
	w.Stop()
	if c, _ := ev.Object.(*corev1.ConfigMap); ev.Type != watch.Added || c == nil || c.Name != "cm" {
		t.Errorf("%s's watch in %s: %s %s, want ADDED cm", user, a, ev.Type, describe(ev.Object))
	}
	if n := cacheReads(t, e, "", "configmaps", "watch"); n <= before {
		t.Errorf("the watch resourceVersion=0 in %s was not served from the proxy's cache", a)
	}

	// The administrator impersonating the user reads as the user: from the cache where the
	// user may, refused alike where not.
	impersonating := func(cfg *rest.Config) kubernetes.Interface {
		cfg = rest.CopyConfig(cfg)
		cfg.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: []string{"system:authenticated"}}
		return e.clients(t, cfg)
	}
	before = cacheReads(t, e, "", "configmaps", "list")
	if _, err := impersonating(e.proxy).CoreV1().ConfigMaps(a).List(ctx(t), metav1.ListOptions{ResourceVersion: "0"}); err != nil {
		t.Errorf("admin as %s lists configmaps in %s through the proxy: %v", user, a, err)
	}
	if n := cacheReads(t, e, "", "configmaps", "list"); n <= before {
		t.Errorf("admin as %s: the list in %s was not served from the proxy's cache", user, a)
	}
	_, dErr := impersonating(e.upstream).CoreV1().ConfigMaps(b).List(ctx(t), metav1.ListOptions{ResourceVersion: "0"})
	_, pErr := impersonating(e.proxy).CoreV1().ConfigMaps(b).List(ctx(t), metav1.ListOptions{ResourceVersion: "0"})
	sameRefusal(t, fmt.Sprintf("admin as %s lists configmaps in %s", user, b), dErr, pErr)

	// A grant taken away upstream is taken away through the proxy too, once its cached
	// access review (10 s) has expired.
	if err := direct.RbacV1().RoleBindings(a).Delete(ctx(t), binding.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, user+" may no longer list configmaps upstream", func() error {
		_, dErr = asUser.CoreV1().ConfigMaps(a).List(ctx(t), metav1.ListOptions{ResourceVersion: "0"})
		if !apierrors.IsForbidden(dErr) {
			return fmt.Errorf("want 403, got %v", dErr)
		}
		return nil
	})
	eventually(t, 30*time.Second, user+" may no longer list configmaps through the proxy", func() error {
		_, pErr = asUserProxied.CoreV1().ConfigMaps(a).List(ctx(t), metav1.ListOptions{ResourceVersion: "0"})
		if !apierrors.IsForbidden(pErr) {
			return fmt.Errorf("want 403, got %v", pErr)
		}
		return nil
	})
	sameRefusal(t, user+" lists configmaps in "+a+" once unbound", dErr, pErr)
}

// listQuery is one list request made both to the proxy and to the upstream.
type listQuery struct {
	name     string
	resource string
	opts     metav1.ListOptions
	// How: "" (JSON), "metadata" (PartialObjectMetadataList), "protobuf" (protobuf only) or
	// "yaml".
	via string
	// Whether the proxy must serve it from its cache (or must not).
	cached bool
	// Whether both must refuse it (the same Status).
	fails bool
}

// pager makes one list request: the items' names at their resourceVersions, and the continue
// token.
type pager func(c context.Context, opts metav1.ListOptions) (items map[string]string, cont string, err error)

// pagerFor is a pager of a core resource in ns through cfg, as via says.
func (e *env) pagerFor(t *testing.T, cfg *rest.Config, via, resource, ns string) pager {
	t.Helper()
	gvr := schema.GroupVersionResource{Version: "v1", Resource: resource}
	names := func(items []metav1.Object) map[string]string {
		out := map[string]string{}
		for _, it := range items {
			out[it.GetName()] = it.GetResourceVersion()
		}
		return out
	}
	switch via {
	case "":
		d, err := dynamic.NewForConfig(cfg)
		if err != nil {
			t.Fatal(err)
		}
		return func(c context.Context, opts metav1.ListOptions) (map[string]string, string, error) {
			list, err := d.Resource(gvr).Namespace(ns).List(c, opts)
			if err != nil {
				return nil, "", err
			}
			var items []metav1.Object
			for i := range list.Items {
				items = append(items, &list.Items[i])
			}
			return names(items), list.GetContinue(), nil
		}
	case "metadata":
		m, err := metadata.NewForConfig(cfg)
		if err != nil {
			t.Fatal(err)
		}
		return func(c context.Context, opts metav1.ListOptions) (map[string]string, string, error) {
			list, err := m.Resource(gvr).Namespace(ns).List(c, opts)
			if err != nil {
				return nil, "", err
			}
			var items []metav1.Object
			for i := range list.Items {
				items = append(items, &list.Items[i])
			}
			return names(items), list.Continue, nil
		}
	case "protobuf", "yaml":
		c := rest.CopyConfig(cfg)
		want := "application/yaml"
		if via == "protobuf" {
			c.ContentType = "application/vnd.kubernetes.protobuf"
			c.AcceptContentTypes = "application/vnd.kubernetes.protobuf"
			want = c.AcceptContentTypes
		}
		client := e.clients(t, c).CoreV1().RESTClient()
		return func(ctx context.Context, opts metav1.ListOptions) (map[string]string, string, error) {
			var contentType string
			body, err := client.Get().Namespace(ns).Resource(resource).
				VersionedParams(&opts, scheme.ParameterCodec).SetHeader("Accept", want).
				Do(ctx).ContentType(&contentType).Raw()
			if err != nil {
				return nil, "", err
			}
			if contentType != want {
				return nil, "", fmt.Errorf("answered in %q, asked for %q", contentType, want)
			}
			var list metav1.PartialObjectMetadataList
			if via == "yaml" {
				err = yaml.Unmarshal(body, &list)
			} else {
				var obj runtime.Object
				obj, _, err = scheme.Codecs.UniversalDeserializer().Decode(body, nil, nil)
				if err == nil {
					var items []metav1.Object
					lm, lerr := meta.ListAccessor(obj)
					if lerr != nil {
						return nil, "", lerr
					}
					if err := meta.EachListItem(obj, func(o runtime.Object) error {
						m, err := meta.Accessor(o)
						items = append(items, m)
						return err
					}); err != nil {
						return nil, "", err
					}
					return names(items), lm.GetContinue(), nil
				}
			}
			if err != nil {
				return nil, "", err
			}
			var items []metav1.Object
			for i := range list.Items {
				items = append(items, &list.Items[i])
			}
			return names(items), list.Continue, nil
		}
	}
	t.Fatalf("no pager %q", via)
	return nil
}

// listAll reads every page of a list; the answer is each item's name at its resourceVersion,
// or the error.
func listAll(c context.Context, page pager, opts metav1.ListOptions) (map[string]string, int, error) {
	items := map[string]string{}
	pages := 0
	for {
		got, cont, err := page(c, opts)
		if err != nil {
			return nil, pages, err
		}
		pages++
		for name, rv := range got {
			if _, dup := items[name]; dup {
				return nil, pages, fmt.Errorf("%s twice in the pages", name)
			}
			items[name] = rv
		}
		if cont == "" {
			return items, pages, nil
		}
		if pages > 50 {
			return nil, pages, fmt.Errorf("more than 50 pages")
		}
		opts.Continue = cont
		opts.ResourceVersion = ""
		opts.ResourceVersionMatch = ""
	}
}

func answerString(items map[string]string, err error) string {
	if err != nil {
		s := statusOf(err)
		return fmt.Sprintf("error %d %s %q", s.Code, s.Reason, s.Message)
	}
	names := make([]string, 0, len(items))
	for n, rv := range items {
		names = append(names, n+"@"+rv)
	}
	sort.Strings(names)
	return "[" + strings.Join(names, " ") + "]"
}

func TestCacheMatchesUpstream(t *testing.T) {
	e := getEnv(t)
	ns := namespace(t, e, "cache-match")
	direct := e.clients(t, e.upstream)
	pods := []struct {
		name, node string
		labels     map[string]string
	}{
		{"p1", "n1", map[string]string{"a": "b"}},
		{"p2", "", map[string]string{"a": "x"}},
		{"p3", "n2", map[string]string{"a": "y", "c": "d"}},
		{"p4", "", nil},
		{"p5", "n1", map[string]string{"c": "d"}},
	}
	for _, p := range pods {
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: p.name, Labels: p.labels},
			Spec:       corev1.PodSpec{NodeName: p.node, Containers: pauseContainer()},
		}
		if _, err := direct.CoreV1().Pods(ns).Create(ctx(t), pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "c" + p.name[1:], Labels: p.labels}}
		if _, err := direct.CoreV1().ConfigMaps(ns).Create(ctx(t), cm, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// One pod runs: status.phase tells it from the pending ones.
	p3, err := direct.CoreV1().Pods(ns).Get(ctx(t), "p3", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p3.Status.Phase = corev1.PodRunning
	if _, err := direct.CoreV1().Pods(ns).UpdateStatus(ctx(t), p3, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	// rv: a version both resources are at; then p1 and c1 change, so that a list at exactly
	// rv differs from the current one.
	podList, err := direct.CoreV1().Pods(ns).List(ctx(t), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	rv := podList.ResourceVersion
	p1, err := direct.CoreV1().Pods(ns).Get(ctx(t), "p1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p1.Annotations = map[string]string{"changed": "yes"}
	if _, err := direct.CoreV1().Pods(ns).Update(ctx(t), p1, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	c1, err := direct.CoreV1().ConfigMaps(ns).Get(ctx(t), "c1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	c1.Data = map[string]string{"changed": "yes"}
	if _, err := direct.CoreV1().ConfigMaps(ns).Update(ctx(t), c1, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}

	var queries []listQuery
	for _, r := range []string{"pods", "configmaps"} {
		add := func(name string, opts metav1.ListOptions, cached bool) {
			queries = append(queries, listQuery{name: r + " " + name, resource: r, opts: opts, cached: cached})
		}
		add("rv=0", metav1.ListOptions{ResourceVersion: "0"}, true)
		add("rv=0 a=b", metav1.ListOptions{ResourceVersion: "0", LabelSelector: "a=b"}, true)
		add("rv=0 a in (x,y)", metav1.ListOptions{ResourceVersion: "0", LabelSelector: "a in (x,y)"}, true)
		add("rv=0 !a", metav1.ListOptions{ResourceVersion: "0", LabelSelector: "!a"}, true)
		add("rv=0 c=d,a!=y", metav1.ListOptions{ResourceVersion: "0", LabelSelector: "c=d,a!=y"}, true)
		name := "p2"
		if r == "configmaps" {
			name = "c2"
		}
		add("rv=0 metadata.name="+name, metav1.ListOptions{ResourceVersion: "0", FieldSelector: "metadata.name=" + name}, true)
		add("rv=0 metadata.name!="+name, metav1.ListOptions{ResourceVersion: "0", FieldSelector: "metadata.name!=" + name}, true)
		add("rv=0 metadata.namespace", metav1.ListOptions{ResourceVersion: "0", FieldSelector: "metadata.namespace=" + ns}, true)
		add("NotOlderThan", metav1.ListOptions{ResourceVersion: rv, ResourceVersionMatch: metav1.ResourceVersionMatchNotOlderThan}, true)
		add("Exact", metav1.ListOptions{ResourceVersion: rv, ResourceVersionMatch: metav1.ResourceVersionMatchExact}, true)
		add("rv limit=2", metav1.ListOptions{ResourceVersion: rv, Limit: 2}, true)
		add("rv=0 limit=2", metav1.ListOptions{ResourceVersion: "0", Limit: 2}, true)
		add("rv=0 limit=2 a", metav1.ListOptions{ResourceVersion: "0", Limit: 2, LabelSelector: "a"}, true)
		add("Exact limit=2", metav1.ListOptions{ResourceVersion: rv, ResourceVersionMatch: metav1.ResourceVersionMatchExact, Limit: 2}, true)
		// Consistent lists are the upstream's to answer.
		add("consistent", metav1.ListOptions{}, false)
	}
	pq := func(name string, opts metav1.ListOptions) {
		opts.ResourceVersion = "0"
		queries = append(queries, listQuery{name: "pods rv=0 " + name, resource: "pods", opts: opts, cached: true})
	}
	pq("spec.nodeName=", metav1.ListOptions{FieldSelector: "spec.nodeName="})
	pq("spec.nodeName=n1", metav1.ListOptions{FieldSelector: "spec.nodeName=n1"})
	pq("spec.nodeName!=n1", metav1.ListOptions{FieldSelector: "spec.nodeName!=n1"})
	pq("status.phase=Pending", metav1.ListOptions{FieldSelector: "status.phase=Pending"})
	pq("status.phase=Running,spec.nodeName=n2", metav1.ListOptions{FieldSelector: "status.phase=Running,spec.nodeName=n2"})
	pq("a in (x,y) spec.nodeName=", metav1.ListOptions{LabelSelector: "a in (x,y)", FieldSelector: "spec.nodeName="})
	pq("spec.nodeName=n1 limit=1", metav1.ListOptions{FieldSelector: "spec.nodeName=n1", Limit: 1})
	// A field configmaps do not have: both refuse it alike.
	queries = append(queries, listQuery{
		name: "configmaps rv=0 spec.nodeName=n1", resource: "configmaps",
		opts: metav1.ListOptions{ResourceVersion: "0", FieldSelector: "spec.nodeName=n1"}, fails: true,
	})

	for _, r := range []string{"pods", "configmaps"} {
		for _, via := range []string{"metadata", "yaml", "protobuf"} {
			queries = append(queries,
				listQuery{name: r + " " + via + " rv=0", resource: r, via: via, opts: metav1.ListOptions{ResourceVersion: "0"}, cached: true},
				listQuery{name: r + " " + via + " rv=0 a=b", resource: r, via: via, opts: metav1.ListOptions{ResourceVersion: "0", LabelSelector: "a=b"}, cached: true},
				listQuery{name: r + " " + via + " rv=0 limit=2", resource: r, via: via, opts: metav1.ListOptions{ResourceVersion: "0", Limit: 2}, cached: true},
			)
		}
	}

	for _, q := range queries {
		proxyPager := e.pagerFor(t, e.proxy, q.via, q.resource, ns)
		directPager := e.pagerFor(t, e.upstream, q.via, q.resource, ns)
		var last string
		deadline := time.Now().Add(15 * time.Second)
		for {
			// rv=0 lists may lag behind, on either side: the answers must meet.
			before := cacheReads(t, e, "", q.resource, "list")
			pItems, pages, pErr := listAll(ctx(t), proxyPager, q.opts)
			cached := cacheReads(t, e, "", q.resource, "list") - before
			dItems, _, dErr := listAll(ctx(t), directPager, q.opts)
			p, d := answerString(pItems, pErr), answerString(dItems, dErr)
			last = fmt.Sprintf("\n proxy:    %s (%d pages, %v served from the cache)\n upstream: %s", p, pages, cached, d)
			if p == d && (dErr != nil) == q.fails {
				t.Logf("%s: %s (%d pages, %v from the cache)", q.name, p, pages, cached)
				if q.cached && cached < 1 {
					t.Errorf("%s: not served from the proxy's cache", q.name)
				}
				if !q.cached && cached > 0 {
					t.Errorf("%s: served from the proxy's cache", q.name)
				}
				break
			}
			if time.Now().After(deadline) {
				t.Errorf("%s: the proxy's answer differs from the upstream's:%s", q.name, last)
				break
			}
			time.Sleep(300 * time.Millisecond)
		}
	}
}

// eventString is a watch event as compared: type, name and resourceVersion.
func eventString(ev watch.Event) string {
	m, err := meta.Accessor(ev.Object)
	if err != nil {
		return fmt.Sprintf("%s %T", ev.Type, ev.Object)
	}
	return fmt.Sprintf("%s %s@%s", ev.Type, m.GetName(), m.GetResourceVersion())
}

// collect reads n events from the watch (bookmarks left out unless keepBookmarks), then waits
// quiet for another one; the test fails when fewer come within timeout.
func collect(t *testing.T, w watch.Interface, n int, keepBookmarks bool, timeout, quiet time.Duration, what string) []watch.Event {
	t.Helper()
	var out []watch.Event
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	for len(out) < n {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				t.Fatalf("%s: the watch ended after %d events", what, len(out))
			}
			if ev.Type == watch.Bookmark && !keepBookmarks {
				continue
			}
			if ev.Type == watch.Error {
				t.Fatalf("%s: an ERROR event after %d events: %s", what, len(out), describe(ev.Object))
			}
			out = append(out, ev)
		case <-timer.C:
			t.Fatalf("%s: %d events within %s, want %d: %v", what, len(out), timeout, n, eventsString(out))
		}
	}
	extra := time.NewTimer(quiet)
	defer extra.Stop()
	for {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				return out
			}
			if ev.Type == watch.Bookmark && !keepBookmarks {
				continue
			}
			t.Errorf("%s: an event more than the %d expected: %s", what, n, eventString(ev))
			return out
		case <-extra.C:
			return out
		}
	}
}

func eventsString(evs []watch.Event) []string {
	out := make([]string, len(evs))
	for i, ev := range evs {
		out[i] = eventString(ev)
	}
	return out
}

func TestCacheWatchFromResourceVersion(t *testing.T) {
	e := getEnv(t)
	ns := namespace(t, e, "cache-watch")
	direct := e.clients(t, e.upstream)
	proxy := e.clients(t, e.proxy)
	base, err := direct.CoreV1().ConfigMaps(ns).Create(ctx(t), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "base"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// A list from the cache that has the configmap: its version is where the watches start.
	listsBefore := cacheReads(t, e, "", "configmaps", "list")
	var start string
	eventually(t, 20*time.Second, "the proxy's list resourceVersion=0 has base", func() error {
		list, err := proxy.CoreV1().ConfigMaps(ns).List(ctx(t), metav1.ListOptions{ResourceVersion: "0"})
		if err != nil {
			return err
		}
		if len(list.Items) != 1 || list.Items[0].ResourceVersion != base.ResourceVersion {
			return fmt.Errorf("%d items", len(list.Items))
		}
		start = list.ResourceVersion
		return nil
	})
	if n := cacheReads(t, e, "", "configmaps", "list"); n <= listsBefore {
		t.Errorf("the list resourceVersion=0 was not served from the proxy's cache")
	}

	// Three changes, each at its version.
	cm, err := direct.CoreV1().ConfigMaps(ns).Create(ctx(t), &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "w"}, Data: map[string]string{"k": "1"},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	createdAt := cm.ResourceVersion
	cm.Data["k"] = "2"
	if cm, err = direct.CoreV1().ConfigMaps(ns).Update(ctx(t), cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := direct.CoreV1().ConfigMaps(ns).Delete(ctx(t), "base", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	// What the upstream sends from the same version is what the proxy must send.
	dw, err := direct.CoreV1().ConfigMaps(ns).Watch(ctx(t), metav1.ListOptions{ResourceVersion: start})
	if err != nil {
		t.Fatal(err)
	}
	want := eventsString(collect(t, dw, 3, false, 20*time.Second, 0, "the upstream's watch from "+start))
	dw.Stop()
	if want[0] != "ADDED w@"+createdAt || want[1] != "MODIFIED w@"+cm.ResourceVersion || !strings.HasPrefix(want[2], "DELETED base@") {
		t.Fatalf("the upstream's watch from %s: %v (the test is wrong)", start, want)
	}

	watchesBefore := cacheReads(t, e, "", "configmaps", "watch")
	pw, err := proxy.CoreV1().ConfigMaps(ns).Watch(ctx(t), metav1.ListOptions{ResourceVersion: start})
	if err != nil {
		t.Fatal(err)
	}
	got := eventsString(collect(t, pw, 3, false, 20*time.Second, 2*time.Second, "the proxy's watch from "+start))
	pw.Stop()
	if !reflect.DeepEqual(got, want) {
		t.Errorf("the proxy's watch from %s:\n got  %v\n want %v", start, got, want)
	}
	if n := cacheReads(t, e, "", "configmaps", "watch"); n <= watchesBefore {
		t.Errorf("the watch from %s was not served from the proxy's cache", start)
	}

	// A streaming list from the same version: the current objects, then the bookmark that
	// ends the initial events.
	opts := metav1.ListOptions{
		ResourceVersion:      start,
		ResourceVersionMatch: metav1.ResourceVersionMatchNotOlderThan,
		SendInitialEvents:    ptr(true),
		AllowWatchBookmarks:  true,
	}
	initial := func(c kubernetes.Interface, what string) (added []string, bookmark *corev1.ConfigMap) {
		t.Helper()
		w, err := c.CoreV1().ConfigMaps(ns).Watch(ctx(t), opts)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		defer w.Stop()
		timer := time.NewTimer(20 * time.Second)
		defer timer.Stop()
		for {
			select {
			case ev, ok := <-w.ResultChan():
				if !ok {
					t.Fatalf("%s: the watch ended after %v", what, added)
				}
				switch ev.Type {
				case watch.Added:
					added = append(added, eventString(ev))
				case watch.Bookmark:
					b, _ := ev.Object.(*corev1.ConfigMap)
					if b != nil && b.Annotations[metav1.InitialEventsAnnotationKey] == "true" {
						return added, b
					}
				default:
					t.Fatalf("%s: %s before the initial events' end", what, eventString(ev))
				}
			case <-timer.C:
				t.Fatalf("%s: no bookmark %s=true within 20 s (initial events %v)", what, metav1.InitialEventsAnnotationKey, added)
			}
		}
	}
	wantAdded, _ := initial(direct, "the upstream's streaming list")
	watchesBefore = cacheReads(t, e, "", "configmaps", "watch")
	gotAdded, bookmark := initial(proxy, "the proxy's streaming list")
	if !reflect.DeepEqual(gotAdded, wantAdded) || !reflect.DeepEqual(gotAdded, []string{"ADDED w@" + cm.ResourceVersion}) {
		t.Errorf("the proxy's streaming list from %s:\n got  %v\n want %v", start, gotAdded, wantAdded)
	}
	if brv, err := strconv.ParseUint(bookmark.ResourceVersion, 10, 64); err != nil {
		t.Errorf("the bookmark's resourceVersion %q: %v", bookmark.ResourceVersion, err)
	} else if wrv, _ := strconv.ParseUint(cm.ResourceVersion, 10, 64); brv < wrv {
		t.Errorf("the bookmark's resourceVersion %d is older than the last change %d", brv, wrv)
	}
	if n := cacheReads(t, e, "", "configmaps", "watch"); n <= watchesBefore {
		t.Errorf("the streaming list from %s was not served from the proxy's cache", start)
	}
	noWatchersLeft(t, e, "configmaps")
}

func TestCacheWatchSelectors(t *testing.T) {
	e := getEnv(t)
	ns := namespace(t, e, "cache-selectors")
	direct := e.clients(t, e.upstream)
	proxy := e.clients(t, e.proxy)
	list, err := proxy.CoreV1().ConfigMaps(ns).List(ctx(t), metav1.ListOptions{ResourceVersion: "0"})
	if err != nil {
		t.Fatal(err)
	}
	start := list.ResourceVersion

	// x enters the selector, leaves it, comes back, changes and goes; y never matches.
	cms := direct.CoreV1().ConfigMaps(ns)
	x, err := cms.Create(ctx(t), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "x", Labels: map[string]string{"a": "b"}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cms.Create(ctx(t), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "y", Labels: map[string]string{"a": "c"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, change := range []func(*corev1.ConfigMap){
		func(c *corev1.ConfigMap) { c.Labels["a"] = "c" },
		func(c *corev1.ConfigMap) { c.Labels["a"] = "b" },
		func(c *corev1.ConfigMap) { c.Data = map[string]string{"k": "v"} },
	} {
		change(x)
		if x, err = cms.Update(ctx(t), x, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if err := cms.Delete(ctx(t), "x", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	// A pod leaves status.phase=Pending when it runs.
	pod, err := direct.CoreV1().Pods(ns).Create(ctx(t), &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "p"},
		Spec:       corev1.PodSpec{NodeName: "n1", Containers: pauseContainer()},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pod.Status.Phase = corev1.PodRunning
	if _, err := direct.CoreV1().Pods(ns).UpdateStatus(ctx(t), pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}

	for _, w := range []struct {
		what  string
		n     int
		watch func(kubernetes.Interface) (watch.Interface, error)
	}{
		{"configmaps a=b", 5, func(c kubernetes.Interface) (watch.Interface, error) {
			return c.CoreV1().ConfigMaps(ns).Watch(ctx(t), metav1.ListOptions{ResourceVersion: start, LabelSelector: "a=b"})
		}},
		{"configmaps metadata.name=x", 5, func(c kubernetes.Interface) (watch.Interface, error) {
			return c.CoreV1().ConfigMaps(ns).Watch(ctx(t), metav1.ListOptions{ResourceVersion: start, FieldSelector: "metadata.name=x"})
		}},
		{"pods status.phase=Pending", 2, func(c kubernetes.Interface) (watch.Interface, error) {
			return c.CoreV1().Pods(ns).Watch(ctx(t), metav1.ListOptions{ResourceVersion: start, FieldSelector: "status.phase=Pending"})
		}},
		{"pods spec.nodeName=n1,status.phase!=Pending", 1, func(c kubernetes.Interface) (watch.Interface, error) {
			return c.CoreV1().Pods(ns).Watch(ctx(t), metav1.ListOptions{ResourceVersion: start, FieldSelector: "spec.nodeName=n1,status.phase!=Pending"})
		}},
	} {
		dw, err := w.watch(direct)
		if err != nil {
			t.Fatal(err)
		}
		want := eventsString(collect(t, dw, w.n, false, 20*time.Second, time.Second, "the upstream's watch "+w.what))
		dw.Stop()
		resource := strings.Fields(w.what)[0]
		before := cacheReads(t, e, "", resource, "watch")
		pw, err := w.watch(proxy)
		if err != nil {
			t.Fatal(err)
		}
		got := eventsString(collect(t, pw, w.n, false, 20*time.Second, time.Second, "the proxy's watch "+w.what))
		pw.Stop()
		if !reflect.DeepEqual(got, want) {
			t.Errorf("the watch %s from %s:\n proxy:    %v\n upstream: %v", w.what, start, got, want)
		} else {
			t.Logf("%s: %v", w.what, got)
		}
		if n := cacheReads(t, e, "", resource, "watch"); n <= before {
			t.Errorf("the watch %s from %s was not served from the proxy's cache", w.what, start)
		}
	}
}

// Many changes at once, from several writers: the proxy's watch from a version has the
// upstream's events, in its order, and its list then has the upstream's objects.
func TestCacheWatchBurst(t *testing.T) {
	e := getEnv(t)
	ns := namespace(t, e, "cache-burst")
	fast := rest.CopyConfig(e.upstream)
	fast.QPS, fast.Burst = 200, 400
	direct := e.clients(t, fast)
	proxy := e.clients(t, e.proxy)
	list, err := proxy.CoreV1().ConfigMaps(ns).List(ctx(t), metav1.ListOptions{ResourceVersion: "0"})
	if err != nil {
		t.Fatal(err)
	}
	start := list.ResourceVersion
	const writers, each = 6, 25
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for i := 0; i < writers; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			for j := 0; j < each; j++ {
				name := fmt.Sprintf("c%d-%d", i, j)
				cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"w": strconv.Itoa(i)}}}
				created, err := direct.CoreV1().ConfigMaps(ns).Create(ctx(t), cm, metav1.CreateOptions{})
				if err != nil {
					errs <- err
					return
				}
				if j%3 == 1 {
					created.Data = map[string]string{"j": strconv.Itoa(j)}
					if _, err := direct.CoreV1().ConfigMaps(ns).Update(ctx(t), created, metav1.UpdateOptions{}); err != nil {
						errs <- err
						return
					}
				}
				if j%5 == 2 {
					if err := direct.CoreV1().ConfigMaps(ns).Delete(ctx(t), name, metav1.DeleteOptions{}); err != nil {
						errs <- err
						return
					}
				}
			}
		}(i)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	// Each writer: 25 creates, 8 updates, 5 deletes.
	n := writers * (each + 8 + 5)
	dw, err := direct.CoreV1().ConfigMaps(ns).Watch(ctx(t), metav1.ListOptions{ResourceVersion: start})
	if err != nil {
		t.Fatal(err)
	}
	want := eventsString(collect(t, dw, n, false, 30*time.Second, time.Second, "the upstream's watch"))
	dw.Stop()
	before := cacheReads(t, e, "", "configmaps", "watch")
	pw, err := proxy.CoreV1().ConfigMaps(ns).Watch(ctx(t), metav1.ListOptions{ResourceVersion: start})
	if err != nil {
		t.Fatal(err)
	}
	got := eventsString(collect(t, pw, n, false, 30*time.Second, time.Second, "the proxy's watch"))
	pw.Stop()
	if !reflect.DeepEqual(got, want) {
		for i := range got {
			if got[i] != want[i] {
				t.Errorf("the proxy's watch from %s differs from the upstream's at event %d of %d: %s, upstream %s", start, i, n, got[i], want[i])
				break
			}
		}
	}
	if c := cacheReads(t, e, "", "configmaps", "watch"); c <= before {
		t.Errorf("the watch from %s was not served from the proxy's cache", start)
	}
	noWatchersLeft(t, e, "configmaps")
	for _, selector := range []string{"", "w=3", "w in (0,5)"} {
		opts := metav1.ListOptions{ResourceVersion: "0", LabelSelector: selector}
		var last string
		eventually(t, 15*time.Second, fmt.Sprintf("the proxy's list (%q) is the upstream's", selector), func() error {
			p, perr := proxy.CoreV1().ConfigMaps(ns).List(ctx(t), opts)
			d, derr := direct.CoreV1().ConfigMaps(ns).List(ctx(t), metav1.ListOptions{LabelSelector: selector})
			if perr != nil || derr != nil {
				return fmt.Errorf("proxy %v, upstream %v", perr, derr)
			}
			pm, dm := map[string]string{}, map[string]string{}
			for _, it := range p.Items {
				pm[it.Name] = it.ResourceVersion
			}
			for _, it := range d.Items {
				dm[it.Name] = it.ResourceVersion
			}
			last = answerString(pm, nil)
			if last != answerString(dm, nil) {
				return fmt.Errorf("\n proxy:    %s\n upstream: %s", last, answerString(dm, nil))
			}
			return nil
		})
	}
}
