package main

// What the simulated nodes' informers saw, for the cluster tests: how often each synced from
// scratch (a list, or a watch that sends its initial events: a relist once it had synced
// before), how many 410s its lists and watches were answered, and, on request, its store
// compared with a list read directly from kube-apiserver.

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"net"
	"net/http"
	"regexp"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
)

// watched is one informer of one node: what it selects, and how often it synced from scratch.
type watched struct {
	resource, namespace string
	field, value        string // a one-term field selector, or none
	informer            cache.SharedIndexInformer
	syncs               atomic.Int64
}

// stats are every node's informers together.
type stats struct {
	// Informers built (stopped ones included), syncs from scratch, 410s.
	built, syncs, gone atomic.Int64
	mu                 sync.Mutex
	all                []*watched
	// Relists and 410s by what was watched ("configmaps", or "configmaps/one" for a
	// one-object informer), and the errors a reflector gave up a list or watch on (the
	// relists that follow one), by kind and error; under mu, made with the stats.
	relistsBy, goneBy, reasons map[string]int64
}

// reason counts err, the error w's reflector stopped listing and watching on, by w's kind
// and the error's text with its numbers and addresses left out.
func (st *stats) reason(w *watched, err error) {
	text := digits.ReplaceAllString(err.Error(), "N")
	if len(text) > 120 {
		text = text[:120]
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	st.reasons[w.kind()+": "+text]++
}

var digits = regexp.MustCompile(`[0-9]+`)

// kind names what w watches, for the breakdowns.
func (w *watched) kind() string {
	if w.field == "metadata.name" {
		return w.resource + "/one"
	}
	return w.resource
}

// count adds one to what's count for w's kind.
func (st *stats) count(what map[string]int64, w *watched) {
	st.mu.Lock()
	defer st.mu.Unlock()
	what[w.kind()]++
}

// informer builds (not starts) an informer of resource under the client g belongs to, as the
// client's generated informers build theirs (streamed initial events where the client
// supports them), counting its syncs and 410s.
func (n *node) informer(g cache.Getter, client kubernetes.Interface, resource, namespace, field, value string, obj runtime.Object) cache.SharedIndexInformer {
	return n.watch(g, client, resource, namespace, field, value, obj).informer
}

// watch is informer, with its record.
func (n *node) watch(g cache.Getter, client kubernetes.Interface, resource, namespace, field, value string, obj runtime.Object) *watched {
	w := &watched{resource: resource, namespace: namespace, field: field, value: value}
	selector := fields.Everything()
	if field != "" {
		selector = fields.OneTermEqualSelector(field, value)
	}
	inner := cache.NewListWatchFromClient(g, resource, namespace, selector)
	st := n.stats
	gone := func(err error) {
		if apierrors.IsResourceExpired(err) || apierrors.IsGone(err) {
			st.gone.Add(1)
			st.count(st.goneBy, w)
		}
	}
	synced := func() {
		if w.syncs.Add(1) > 1 {
			st.count(st.relistsBy, w)
		}
		st.syncs.Add(1)
	}
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			synced()
			list, err := inner.ListWithContext(ctx, o)
			gone(err)
			return list, err
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			if o.SendInitialEvents != nil && *o.SendInitialEvents {
				synced()
			}
			wi, err := inner.WatchWithContext(ctx, o)
			if err != nil {
				gone(err)
				return nil, err
			}
			return watch.Filter(wi, func(e watch.Event) (watch.Event, bool) {
				if e.Type == watch.Error {
					gone(apierrors.FromObject(e.Object))
				}
				return e, true
			}), nil
		},
	}
	w.informer = cache.NewSharedIndexInformerWithOptions(cache.ToListWatcherWithWatchListSemantics(lw, client), obj,
		cache.SharedIndexInformerOptions{})
	_ = w.informer.SetWatchErrorHandlerWithContext(func(ctx context.Context, r *cache.Reflector, err error) {
		st.reason(w, err)
		cache.DefaultWatchErrorHandler(ctx, r, err)
	})
	if resource != "pods" {
		// Read and decoded in full, as a node does; kept as what the stores are compared by.
		_ = w.informer.SetTransform(keepMeta)
	}
	st.mu.Lock()
	st.all = append(st.all, w)
	st.mu.Unlock()
	st.built.Add(1)
	return w
}

// keepMeta keeps of an object its name, namespace, UID and resourceVersion, what the stores
// are compared by. Thousands of simulated nodes in one process each hold every Service and
// EndpointSlice of the cluster, which real nodes hold on machines of their own: in full, at
// 3,000 nodes and 3,000 pods, that was 13 GiB. A pod is kept whole (the node runs it).
func keepMeta(o any) (any, error) {
	m, err := meta.Accessor(o)
	if err != nil {
		return o, nil // a tombstone: kept as it is
	}
	return &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{
		Name: m.GetName(), Namespace: m.GetNamespace(), UID: m.GetUID(), ResourceVersion: m.GetResourceVersion(),
	}}, nil
}

// remove forgets a stopped informer: its store is no longer compared.
func (st *stats) remove(w *watched) {
	st.mu.Lock()
	defer st.mu.Unlock()
	for i, x := range st.all {
		if x == w {
			st.all = append(st.all[:i], st.all[i+1:]...)
			return
		}
	}
}

func (st *stats) informers() []*watched {
	st.mu.Lock()
	defer st.mu.Unlock()
	return append([]*watched(nil), st.all...)
}

// serve answers on addr:
//
//	/counts   {"nodes","informers","built","syncs","relists","gone"}: informers running,
//	          informers built (stopped ones too), and relists, the syncs past each one's first
//	/by       {"relists": {kind: n}, "gone": {kind: n}, "reasons": {"kind: error": n}}: relists
//	          and 410s by what was watched ("configmaps", or "configmaps/one" for a one-object
//	          informer), and the errors reflectors stopped on before listing again
//	/seen?resource=R&namespace=N&name=X
//	          {"informers","have"}: how many informers of R hold N/X
//	/compare  {"informers","objects","differ","stores_differ","example","by"}: every informer's
//	          store against a list read directly from kube-apiserver (--compare-kubeconfig), by
//	          name and resourceVersion, read 5 s after the list (a newer version in a store is
//	          a write after the list, not a difference); "by" counts the objects that differ
//	          by resource and how (missing, extra, other-version: older than the list's)
func (st *stats) serve(addr, compareKubeconfig string, running *atomic.Int64) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	reply := func(w http.ResponseWriter, v any) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(v)
	}
	mux.HandleFunc("/counts", func(w http.ResponseWriter, _ *http.Request) {
		syncs, built := st.syncs.Load(), st.built.Load()
		reply(w, map[string]int64{
			"nodes": running.Load(), "informers": int64(len(st.informers())), "built": built,
			"syncs": syncs, "relists": syncs - built, "gone": st.gone.Load(),
		})
	})
	mux.HandleFunc("/by", func(w http.ResponseWriter, _ *http.Request) {
		st.mu.Lock()
		defer st.mu.Unlock()
		reply(w, map[string]map[string]int64{"relists": st.relistsBy, "gone": st.goneBy, "reasons": st.reasons})
	})
	mux.HandleFunc("/seen", func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		key := q.Get("name")
		if ns := q.Get("namespace"); ns != "" {
			key = ns + "/" + key
		}
		var informers, have int
		for _, x := range st.informers() {
			if x.resource != q.Get("resource") {
				continue
			}
			informers++
			if _, ok, _ := x.informer.GetStore().GetByKey(key); ok {
				have++
			}
		}
		reply(w, map[string]int{"informers": informers, "have": have})
	})
	mux.HandleFunc("/compare", func(w http.ResponseWriter, r *http.Request) {
		if compareKubeconfig == "" {
			http.Error(w, "no --compare-kubeconfig", http.StatusBadRequest)
			return
		}
		out, err := st.compare(r.Context(), compareKubeconfig)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		reply(w, out)
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && err != http.ErrServerClosed {
			log.Printf("status server: %v", err)
		}
	}()
	return nil
}

// group of each resource the nodes watch, for the direct lists.
var groupVersion = map[string][2]string{
	"pods": {"", "v1"}, "nodes": {"", "v1"}, "services": {"", "v1"}, "configmaps": {"", "v1"},
	"secrets": {"", "v1"}, "runtimeclasses": {"node.k8s.io", "v1"}, "csidrivers": {"storage.k8s.io", "v1"},
	"endpointslices": {"discovery.k8s.io", "v1"}, "servicecidrs": {"networking.k8s.io", "v1"},
}

type comparison struct {
	Informers    int    `json:"informers"`
	Objects      int    `json:"objects"`
	Differ       int    `json:"differ"`
	StoresDiffer int    `json:"stores_differ"`
	Example      string `json:"example,omitempty"`
	// The objects that differ, by resource and by how: missing, extra, or older or newer
	// (another resourceVersion) in the store.
	By map[string]int `json:"by,omitempty"`
}

// compare reads each watched resource once, directly from kube-apiserver, and counts the
// objects in which each store differs from what its selector picks out of that list: missing,
// extra, or at another resourceVersion.
// compareGrace is how long after its list /compare reads the stores: the time a write the
// list holds has to reach every informer.
const compareGrace = 5 * time.Second

// older reports whether resourceVersion a comes before b. kube-apiserver's are etcd
// revisions; versions that are not numbers are older when they differ.
func older(a, b string) bool {
	x, errA := strconv.ParseUint(a, 10, 64)
	y, errB := strconv.ParseUint(b, 10, 64)
	if errA != nil || errB != nil {
		return a != b
	}
	return x < y
}

func (st *stats) compare(ctx context.Context, kubeconfig string) (comparison, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return comparison{}, err
	}
	cfg.QPS, cfg.Burst = 50, 100
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return comparison{}, err
	}
	// direct[resource][namespace/name] = the object's resourceVersion and its pod's node.
	type entry struct{ rv, node string }
	direct := map[string]map[string]entry{}
	all := st.informers()
	for _, x := range all {
		if direct[x.resource] != nil {
			continue
		}
		gv := groupVersion[x.resource]
		list, err := dyn.Resource(schema.GroupVersionResource{Group: gv[0], Version: gv[1], Resource: x.resource}).List(ctx, metav1.ListOptions{})
		if err != nil {
			return comparison{}, fmt.Errorf("listing %s: %w", x.resource, err)
		}
		m := map[string]entry{}
		for _, o := range list.Items {
			key := o.GetName()
			if o.GetNamespace() != "" {
				key = o.GetNamespace() + "/" + key
			}
			node, _, _ := unstructured.NestedString(o.Object, "spec", "nodeName")
			m[key] = entry{rv: o.GetResourceVersion(), node: node}
		}
		direct[x.resource] = m
	}
	// Agents keep writing (node status, leases) while the stores are compared: a store is
	// behind only if, a delivery's grace after the list, it still holds a version older than
	// the list's. A newer one is a write after the list, already delivered.
	select {
	case <-ctx.Done():
		return comparison{}, ctx.Err()
	case <-time.After(compareGrace):
	}
	var out comparison
	for _, x := range all {
		out.Informers++
		want := map[string]string{}
		for key, e := range direct[x.resource] {
			ns, name, _ := cache.SplitMetaNamespaceKey(key)
			if x.namespace != "" && ns != x.namespace {
				continue
			}
			switch x.field {
			case "metadata.name":
				if name != x.value {
					continue
				}
			case "spec.nodeName":
				if e.node != x.value {
					continue
				}
			}
			want[key] = e.rv
		}
		have := map[string]string{}
		for _, o := range x.informer.GetStore().List() {
			m, err := meta.Accessor(o)
			if err != nil {
				continue
			}
			key, _ := cache.MetaNamespaceKeyFunc(o)
			have[key] = m.GetResourceVersion()
		}
		differ := 0
		var keys []string
		count := func(how string) {
			if out.By == nil {
				out.By = map[string]int{}
			}
			out.By[x.resource+"/"+how]++
		}
		for key, rv := range want {
			got, ok := have[key]
			switch {
			case !ok:
				count("missing")
			case !older(got, rv):
				continue
			default:
				count("other-version")
			}
			differ++
			keys = append(keys, key)
		}
		for key := range have {
			if _, ok := want[key]; !ok {
				count("extra")
				differ++
				keys = append(keys, key)
			}
		}
		out.Objects += len(want)
		out.Differ += differ
		if differ > 0 {
			out.StoresDiffer++
			if out.Example == "" {
				sort.Strings(keys)
				out.Example = fmt.Sprintf("%s %s=%s in %q: %v", x.resource, x.field, x.value, x.namespace, keys[:min(len(keys), 3)])
			}
		}
	}
	return out, nil
}
