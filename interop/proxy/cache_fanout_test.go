package proxy

import (
	"context"
	"fmt"
	"net"
	"reflect"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
)

// upstreamMetrics reads the upstream kube-apiserver's /metrics as the admin.
func upstreamMetrics(t *testing.T, e *env) []sample {
	t.Helper()
	body, err := e.clients(t, e.upstream).Discovery().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx(t))
	if err != nil {
		t.Fatalf("reading the upstream's /metrics: %v", err)
	}
	samples, err := parseMetrics(string(body))
	if err != nil {
		t.Fatalf("the upstream's /metrics: %v", err)
	}
	return samples
}

// upstreamWatches is the number of watch requests of a core resource open at the upstream
// (apiserver_longrunning_requests, every scope), and the same per scope.
func upstreamWatches(t *testing.T, e *env, resource string) (float64, string) {
	t.Helper()
	var total float64
	var scopes []string
	for _, s := range upstreamMetrics(t, e) {
		if s.name != "apiserver_longrunning_requests" || s.labels["group"] != "" || s.labels["resource"] != resource || s.labels["verb"] != "WATCH" {
			continue
		}
		total += s.value
		scopes = append(scopes, fmt.Sprintf("%s=%v", s.labels["scope"], s.value))
	}
	sort.Strings(scopes)
	return total, strings.Join(scopes, " ")
}

// Many watches of one resource through the proxy are served from its cache, fed by its one
// upstream watch of the resource: the upstream holds a handful of watches, not one per client.
func TestCacheHoldsOneUpstreamWatch(t *testing.T) {
	e := getEnv(t)
	ns := namespace(t, e, "cache-fanout")
	direct := e.clients(t, e.upstream)
	// The upstream's watches of configmaps before: kube-apiserver's own (over loopback, of
	// kube-system's configmaps and of one of them), the proxy's, and any an earlier test's
	// client passed through the proxy and left.
	before, beforeScopes := upstreamWatches(t, e, "configmaps")

	// One client, so one transport: its watches share one HTTP/2 connection, or a few when the
	// proxy limits the streams of one. Dial counts the connections; no rate limit.
	var dials atomic.Int32
	cfg := rest.CopyConfig(e.proxy)
	cfg.QPS = -1
	cfg.Dial = func(c context.Context, network, address string) (net.Conn, error) {
		dials.Add(1)
		var d net.Dialer
		return d.DialContext(c, network, address)
	}
	proxy := e.clients(t, cfg)
	list, err := proxy.CoreV1().ConfigMaps(ns).List(ctx(t), metav1.ListOptions{ResourceVersion: "0"})
	if err != nil {
		t.Fatal(err)
	}
	from := list.ResourceVersion
	watchReads := cacheReads(t, e, "", "configmaps", "watch")

	const n = 200
	wctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	watches := make([]watch.Interface, n)
	defer func() {
		for _, w := range watches {
			if w != nil {
				w.Stop()
			}
		}
	}()
	opened := time.Now()
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range watches {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			watches[i], errs[i] = proxy.CoreV1().ConfigMaps(ns).Watch(wctx, metav1.ListOptions{ResourceVersion: from})
		}(i)
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("watch %d of %d from %s through the proxy: %v", i, n, from, err)
		}
	}
	t.Logf("%d watches from %s open through the proxy in %s over %d connection(s)", n, from, time.Since(opened).Round(time.Millisecond), dials.Load())
	if c := cacheReads(t, e, "", "configmaps", "watch"); c < watchReads+n {
		t.Errorf("svc_proxy_cache_reads_total{resource=configmaps,verb=watch} rose by %v, want %d: the watches were not all served from the cache", c-watchReads, n)
	}

	// Writes upstream: every watch has them, in the upstream's order.
	a, err := direct.CoreV1().ConfigMaps(ns).Create(ctx(t), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "a"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	a.Data = map[string]string{"k": "v"}
	if a, err = direct.CoreV1().ConfigMaps(ns).Update(ctx(t), a, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	b, err := direct.CoreV1().ConfigMaps(ns).Create(ctx(t), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "b"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := direct.CoreV1().ConfigMaps(ns).Delete(ctx(t), "a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	dw, err := direct.CoreV1().ConfigMaps(ns).Watch(ctx(t), metav1.ListOptions{ResourceVersion: from})
	if err != nil {
		t.Fatal(err)
	}
	want := eventsString(collect(t, dw, 4, false, 20*time.Second, 0, "the upstream's watch"))
	dw.Stop()
	if want[1] != "MODIFIED a@"+a.ResourceVersion || want[2] != "ADDED b@"+b.ResourceVersion {
		t.Fatalf("the upstream's watch from %s: %v", from, want)
	}

	// While the watches are open and have had their events: the upstream's watches and the
	// proxy's own.
	var upstream float64
	var scopes string
	got := make([][]string, n)
	problems := make([]string, n)
	for i, w := range watches {
		wg.Add(1)
		go func(i int, w watch.Interface) {
			defer wg.Done()
			timer := time.NewTimer(30 * time.Second)
			defer timer.Stop()
			for len(got[i]) < len(want) {
				select {
				case ev, ok := <-w.ResultChan():
					if !ok {
						problems[i] = fmt.Sprintf("the watch ended after %v", got[i])
						return
					}
					if ev.Type == watch.Bookmark {
						continue
					}
					if ev.Type == watch.Error {
						problems[i] = fmt.Sprintf("an ERROR event after %v: %s", got[i], describe(ev.Object))
						return
					}
					got[i] = append(got[i], eventString(ev))
				case <-timer.C:
					problems[i] = fmt.Sprintf("only %v within 30s", got[i])
					return
				}
			}
		}(i, w)
	}
	upstream, scopes = upstreamWatches(t, e, "configmaps")
	wg.Wait()
	bad := 0
	for i := range watches {
		switch {
		case problems[i] != "":
			bad++
			if bad <= 5 {
				t.Errorf("watch %d of %d through the proxy: %s", i, n, problems[i])
			}
		case !reflect.DeepEqual(got[i], want):
			bad++
			if bad <= 5 {
				t.Errorf("watch %d of %d through the proxy: %v, upstream %v", i, n, got[i], want)
			}
		}
	}
	if bad > 0 {
		t.Errorf("%d of %d watches through the proxy did not have the upstream's 4 events", bad, n)
	}
	samples := proxyMetrics(t, e)
	proxyWatches, found := sum(samples, "svc_proxy_upstream_watches", map[string]string{"group": "", "version": "v1", "resource": "configmaps"})
	watchers, _ := sum(samples, "svc_proxy_cache_watchers", map[string]string{"group": "", "resource": "configmaps"})
	open, _ := sum(samples, "apiserver_registered_watchers", map[string]string{"group": "", "version": "v1", "kind": "ConfigMap"})
	if again, againScopes := upstreamWatches(t, e, "configmaps"); again > upstream {
		upstream, scopes = again, againScopes
	}
	t.Logf("with %d watches of configmaps open through the proxy: apiserver_longrunning_requests{resource=configmaps,verb=WATCH} at the upstream %v (%s; %v before: %s), svc_proxy_upstream_watches{resource=configmaps} %v, svc_proxy_cache_watchers{resource=configmaps} %v, apiserver_registered_watchers{kind=ConfigMap} %v",
		n, upstream, scopes, before, beforeScopes, proxyWatches, watchers, open)
	if !found || proxyWatches != 1 {
		t.Errorf("svc_proxy_upstream_watches{group=\"\",version=\"v1\",resource=\"configmaps\"} is %v (found %v), want 1", proxyWatches, found)
	}
	// The proxy's one watch is open before and after; a short freshness probe may come and go.
	// Compared with before, not with a fixed number: kube-apiserver watches configmaps itself,
	// and watches earlier tests passed through may still be open upstream.
	if upstream > before+2 {
		t.Errorf("the upstream holds %v watches of configmaps (%s) with %d open through the proxy, %v before (%s): want at most 2 more than before", upstream, scopes, n, before, beforeScopes)
	}
	// Every watch is open at the proxy and served from its cache. Once caught up, the watches
	// of one watch on one h2 connection share one registration with the cache: client-go
	// multiplexes all of these on one connection, so from 1 to n registrations.
	if open < float64(n) {
		t.Errorf("apiserver_registered_watchers{kind=ConfigMap} at the proxy is %v with %d watches open", open, n)
	}
	if watchers < 1 || watchers > float64(n) {
		t.Errorf("svc_proxy_cache_watchers{resource=configmaps} is %v with %d watches open: want 1 to %d", watchers, n, n)
	}
	for i, w := range watches {
		w.Stop()
		watches[i] = nil
	}
	noWatchersLeft(t, e, "configmaps")
}
