package proxy

// The file sorts last: its test restarts the upstream, after every other test of the package.

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
)

// restartUpstream stops the upstream's kube-apiserver and etcd and starts them again with
// kube.sh, on the same port and the same etcd data: INTEROP_UPSTREAM_DIR is the folder
// `kube.sh start` was given.
func restartUpstream(t *testing.T) {
	t.Helper()
	dir := os.Getenv("INTEROP_UPSTREAM_DIR")
	if dir == "" {
		t.Skip("INTEROP_UPSTREAM_DIR is not set (interop/run.sh sets it)")
	}
	// The test binary runs in interop/proxy, as go test runs it.
	kubeSh, err := filepath.Abs(filepath.Join("..", "kube.sh"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(kubeSh); err != nil {
		t.Skipf("no kube.sh next to the package: %v", err)
	}
	c, cancel := context.WithTimeout(context.Background(), 150*time.Second)
	defer cancel()
	for _, action := range []string{"stop", "start"} {
		start := time.Now()
		cmd := exec.CommandContext(c, kubeSh, action, dir)
		// kube-apiserver stops listening at once on TERM but may take its time to exit with
		// watches open: KILL it after 5 s (etcd, stopped after it, keeps every write).
		cmd.Env = append(os.Environ(), "KUBE_STOP_TIMEOUT=5")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("kube.sh %s %s: %v\n%s", action, dir, err, out)
		}
		t.Logf("kube.sh %s: %s %s", action, time.Since(start).Round(time.Millisecond), strings.TrimSpace(string(out)))
	}
}

func TestCacheSurvivesUpstreamRestart(t *testing.T) {
	e := getEnv(t)
	if os.Getenv("INTEROP_UPSTREAM_DIR") == "" {
		t.Skip("INTEROP_UPSTREAM_DIR is not set (interop/run.sh sets it)")
	}
	ns := namespace(t, e, "cache-restart")
	proxy := e.clients(t, e.proxy)
	direct := e.clients(t, e.upstream)
	before, err := direct.CoreV1().ConfigMaps(ns).Create(ctx(t), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "before"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// A watch served from the cache, from the version of a list from the cache.
	var from string
	eventually(t, 20*time.Second, "the proxy's list resourceVersion=0 has the configmap", func() error {
		list, err := proxy.CoreV1().ConfigMaps(ns).List(ctx(t), metav1.ListOptions{ResourceVersion: "0"})
		if err != nil {
			return err
		}
		if len(list.Items) != 1 || list.Items[0].ResourceVersion != before.ResourceVersion {
			return fmt.Errorf("%d items", len(list.Items))
		}
		from = list.ResourceVersion
		return nil
	})
	watches := cacheReads(t, e, "", "configmaps", "watch")
	wctx, cancel := context.WithTimeout(context.Background(), 240*time.Second)
	defer cancel()
	w, err := proxy.CoreV1().ConfigMaps(ns).Watch(wctx, metav1.ListOptions{ResourceVersion: from})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	if n := cacheReads(t, e, "", "configmaps", "watch"); n <= watches {
		t.Fatalf("the watch from %s was not served from the proxy's cache", from)
	}
	lists := sumOf(t, e, "svc_proxy_upstream_lists_total", "configmaps")

	restartUpstream(t)

	// Nothing happened in the namespace: the watch is open and quiet.
	select {
	case ev, ok := <-w.ResultChan():
		if !ok {
			t.Fatal("the proxy's watch ended with the upstream's restart")
		}
		if ev.Type != watch.Bookmark {
			t.Errorf("the proxy's watch across the upstream's restart: %s", eventString(ev))
		}
	default:
	}
	after, err := direct.CoreV1().ConfigMaps(ns).Create(ctx(t), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "after"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating a configmap after the upstream's restart: %v", err)
	}
	start := time.Now()
	ev := nextEvent(t, w, 60*time.Second, "the proxy's watch after the upstream's restart")
	if c, _ := ev.Object.(*corev1.ConfigMap); ev.Type != watch.Added || c == nil || c.Name != "after" || c.ResourceVersion != after.ResourceVersion {
		t.Errorf("the proxy's watch after the upstream's restart: %s, want ADDED after@%s", eventString(ev), after.ResourceVersion)
	}
	t.Logf("the configmap created after the restart reached the watch in %s", time.Since(start).Round(time.Millisecond))
	t.Logf("svc_proxy_upstream_lists_total{resource=configmaps}: %v before the restart, %v after", lists, sumOf(t, e, "svc_proxy_upstream_lists_total", "configmaps"))

	// The proxy is ready again, and its lists from the cache have the new configmap.
	anon := e.clients(t, rest.AnonymousClientConfig(e.proxy)).Discovery().RESTClient()
	eventually(t, 45*time.Second, "the proxy's /readyz", func() error {
		body, err := anon.Get().AbsPath("/readyz").DoRaw(ctx(t))
		if err != nil || string(body) != "ok" {
			return fmt.Errorf("%q, %v", body, err)
		}
		return nil
	})
	lists = cacheReads(t, e, "", "configmaps", "list")
	list, err := proxy.CoreV1().ConfigMaps(ns).List(ctx(t), metav1.ListOptions{ResourceVersion: after.ResourceVersion, ResourceVersionMatch: metav1.ResourceVersionMatchNotOlderThan})
	if err != nil {
		t.Fatal(err)
	}
	if names := itemNames(list.Items); names != "after before" {
		t.Errorf("the proxy's list after the upstream's restart: %s", names)
	}
	if n := cacheReads(t, e, "", "configmaps", "list"); n <= lists {
		t.Errorf("the list after the upstream's restart was not served from the proxy's cache")
	}
}

func sumOf(t *testing.T, e *env, name, resource string) float64 {
	t.Helper()
	n, _ := sum(proxyMetrics(t, e), name, map[string]string{"group": "", "resource": resource})
	return n
}

func itemNames(items []corev1.ConfigMap) string {
	var names []string
	for _, it := range items {
		names = append(names, it.Name)
	}
	return strings.Join(names, " ")
}
