package proxy

// The file sorts after zz_restart_test.go: its test restarts the proxy, last of the package.
// Either order would leave both tests valid (each waits for the proxy to be ready, and the
// proxy keeps its port and serving CA), but a proxy that failed to come back would fail every
// test after this one.

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
)

// request is one request a client made, as its transport saw it.
type request struct {
	at     time.Time
	method string
	path   string
	query  string
	status int
	err    error
	// expired: the answer, or an event of the watch stream it carries, had code 410.
	expired bool
}

func (r *request) String() string {
	s := fmt.Sprintf("%s %s %s?%s", r.at.Format("15:04:05.000"), r.method, r.path, r.query)
	if r.err != nil {
		s += fmt.Sprintf(" -> %v", r.err)
	} else {
		s += fmt.Sprintf(" -> %d", r.status)
	}
	if r.expired {
		s += " (410)"
	}
	return s
}

// isWatch says whether the request is a watch; initial whether it is a list or a watch that
// starts with the current state (sendInitialEvents=true): what an informer does to (re)list.
func (r *request) isWatch() bool {
	q, _ := url.ParseQuery(r.query)
	return q.Get("watch") == "true" || q.Get("watch") == "1"
}

func (r *request) initial() bool {
	q, _ := url.ParseQuery(r.query)
	if r.method != http.MethodGet {
		return false
	}
	return !r.isWatch() || q.Get("sendInitialEvents") == "true"
}

func (r *request) resourceVersion() string {
	q, _ := url.ParseQuery(r.query)
	return q.Get("resourceVersion")
}

// requestLog records the requests a client makes through a transport wrapped with wrap, and
// whether any answer was 410 Gone, as a status or as an ERROR event in a watch's stream.
type requestLog struct {
	mu   sync.Mutex
	reqs []*request
}

type roundTripperFunc func(*http.Request) (*http.Response, error)

func (f roundTripperFunc) RoundTrip(req *http.Request) (*http.Response, error) { return f(req) }

func (l *requestLog) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripperFunc(func(req *http.Request) (*http.Response, error) {
		r := &request{at: time.Now(), method: req.Method, path: req.URL.Path, query: req.URL.RawQuery}
		l.mu.Lock()
		l.reqs = append(l.reqs, r)
		l.mu.Unlock()
		resp, err := rt.RoundTrip(req)
		l.mu.Lock()
		defer l.mu.Unlock()
		if err != nil {
			r.err = err
			return resp, err
		}
		r.status = resp.StatusCode
		if resp.StatusCode == http.StatusGone {
			r.expired = true
		}
		resp.Body = &scan410{ReadCloser: resp.Body, found: func() {
			l.mu.Lock()
			r.expired = true
			l.mu.Unlock()
		}}
		return resp, nil
	})
}

// since is the requests made at or after t.
func (l *requestLog) since(t time.Time) []*request {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []*request
	for _, r := range l.reqs {
		if !r.at.Before(t) {
			c := *r
			out = append(out, &c)
		}
	}
	return out
}

func requestsString(reqs []*request) string {
	var b strings.Builder
	for _, r := range reqs {
		b.WriteString("\n  ")
		b.WriteString(r.String())
	}
	return b.String()
}

// scan410 passes a body on and calls found when it carries "code":410 (a Status of 410, as a
// watch's ERROR event has it); the bodies are JSON.
type scan410 struct {
	io.ReadCloser
	tail  []byte
	found func()
}

var code410 = []byte(`"code":410`)

func (s *scan410) Read(p []byte) (int, error) {
	n, err := s.ReadCloser.Read(p)
	if n > 0 {
		buf := append(s.tail, p[:n]...)
		if bytes.Contains(buf, code410) {
			s.found()
		}
		if keep := len(code410) - 1; len(buf) > keep {
			buf = buf[len(buf)-keep:]
		}
		s.tail = append([]byte(nil), buf...)
	}
	return n, err
}

// gatewaySh runs interop/gateway.sh with the test's environment (SVC_GATEWAY_BIN,
// SVC_PROXY_EXTRA_FLAGS as run.sh passes them), so the proxy restarts configured as it was.
func gatewaySh(t *testing.T, args ...string) {
	t.Helper()
	sh, err := filepath.Abs(filepath.Join("..", "gateway.sh"))
	if err != nil {
		t.Fatal(err)
	}
	c, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	start := time.Now()
	out, err := exec.CommandContext(c, sh, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("gateway.sh %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	t.Logf("gateway.sh %s: %s %s", args[0], time.Since(start).Round(time.Millisecond), strings.TrimSpace(string(out)))
}

// A restart of the proxy is, to its clients, a dropped connection: an informer through it
// watches again from the resourceVersion it holds, which the restarted proxy (its cache younger
// than that version) passes upstream, and the informer neither lists again nor sees a 410; a
// watch reopened from the last version it had has every event since. The proxy keeps its port
// and its serving CA (on disk), so the clients' configuration stays right.
func TestCacheProxyRestart(t *testing.T) {
	e := getEnv(t)
	dir, upDir := os.Getenv("INTEROP_PROXY_DIR"), os.Getenv("INTEROP_UPSTREAM_DIR")
	if dir == "" || upDir == "" {
		t.Skip("INTEROP_PROXY_DIR or INTEROP_UPSTREAM_DIR is not set (interop/run.sh sets them)")
	}
	if _, err := os.Stat(filepath.Join("..", "gateway.sh")); err != nil {
		t.Skipf("no gateway.sh next to the package: %v", err)
	}
	caFile := filepath.Join(dir, "data", "pki", "ca.crt")
	caBefore, err := os.ReadFile(caFile)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(caBefore, e.proxyCA) {
		t.Fatalf("%s is not the CA the tests trust (INTEROP_PROXY_CA): INTEROP_PROXY_DIR is not this proxy's", caFile)
	}
	ns := namespace(t, e, "proxy-restart")
	direct := e.clients(t, e.upstream)
	create := func(name string) *corev1.ConfigMap {
		t.Helper()
		c, err := direct.CoreV1().ConfigMaps(ns).Create(ctx(t), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("creating %s upstream: %v", name, err)
		}
		return c
	}
	first := create("first")

	// An informer as a controller runs it (client-go's defaults: WatchList on), in JSON so that
	// the request log can find a 410 in its watch streams.
	informerLog := &requestLog{}
	cfg := rest.CopyConfig(e.proxy)
	cfg.ContentType, cfg.AcceptContentTypes = "application/json", "application/json"
	cfg.Wrap(informerLog.wrap)
	factory := informers.NewSharedInformerFactoryWithOptions(e.clients(t, cfg), 0, informers.WithNamespace(ns))
	informer := factory.Core().V1().ConfigMaps().Informer()
	handled := newSeen()
	if _, err := informer.AddEventHandler(handled.handler()); err != nil {
		t.Fatal(err)
	}
	var watchErrsMu sync.Mutex
	var watchErrs []string
	if err := informer.SetWatchErrorHandlerWithContext(func(c context.Context, r *cache.Reflector, err error) {
		watchErrsMu.Lock()
		watchErrs = append(watchErrs, fmt.Sprintf("%s %v", time.Now().Format("15:04:05.000"), err))
		watchErrsMu.Unlock()
		cache.DefaultWatchErrorHandler(c, r, err)
	}); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	factory.Start(stop)
	defer func() {
		close(stop)
		factory.Shutdown()
	}()
	syncCtx, cancelSync := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancelSync()
	if !cache.WaitForCacheSync(syncCtx.Done(), informer.HasSynced) {
		t.Fatalf("the informer through the proxy did not sync:%s", requestsString(informerLog.since(time.Time{})))
	}
	eventually(t, 10*time.Second, "the informer has the first configmap", func() error { return handled.at("first", first.ResourceVersion) })

	// A watch of the namespace from a list from the proxy's cache, and an event on it.
	rawLog := &requestLog{}
	rawCfg := rest.CopyConfig(e.proxy)
	rawCfg.ContentType, rawCfg.AcceptContentTypes = "application/json", "application/json"
	rawCfg.Wrap(rawLog.wrap)
	raw := e.clients(t, rawCfg)
	list, err := raw.CoreV1().ConfigMaps(ns).List(ctx(t), metav1.ListOptions{ResourceVersion: "0"})
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancelWatches := context.WithTimeout(context.Background(), 150*time.Second)
	defer cancelWatches()
	w, err := raw.CoreV1().ConfigMaps(ns).Watch(wctx, metav1.ListOptions{ResourceVersion: list.ResourceVersion})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { w.Stop() }()
	second := create("second")
	ev := nextEvent(t, w, 20*time.Second, "the watch through the proxy before its restart")
	if c, _ := ev.Object.(*corev1.ConfigMap); ev.Type != watch.Added || c == nil || c.Name != "second" {
		t.Fatalf("the watch through the proxy before its restart: %s, want ADDED second@%s", eventString(ev), second.ResourceVersion)
	}
	last := second.ResourceVersion
	eventually(t, 10*time.Second, "the informer has the second configmap", func() error { return handled.at("second", second.ResourceVersion) })

	// The restart, with writes upstream while the proxy is down.
	restarted := time.Now()
	informerBefore := informerLog.since(time.Time{})
	gatewaySh(t, "stop", dir)
	// Whatever happens from here, the proxy runs again at the end (start-proxy does nothing
	// when it already runs).
	defer func() {
		if t.Failed() {
			_ = exec.Command(filepath.Join("..", "gateway.sh"), "start-proxy", dir, upDir).Run()
		}
	}()
	down := create("while-down")
	first.Data = map[string]string{"changed": "while the proxy was down"}
	if first, err = direct.CoreV1().ConfigMaps(ns).Update(ctx(t), first, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	gatewaySh(t, "start-proxy", dir, upDir)
	anon := e.clients(t, rest.AnonymousClientConfig(e.proxy)).Discovery().RESTClient()
	eventually(t, 30*time.Second, "the proxy's /readyz after its restart", func() error {
		body, err := anon.Get().AbsPath("/readyz").DoRaw(ctx(t))
		if err != nil || string(body) != "ok" {
			return fmt.Errorf("%q, %v", body, err)
		}
		return nil
	})
	ready := time.Now()
	t.Logf("the proxy was down and back, ready, in %s", ready.Sub(restarted).Round(time.Millisecond))
	for _, f := range []string{caFile, filepath.Join(dir, "ca.crt")} {
		if caAfter, err := os.ReadFile(f); err != nil || !bytes.Equal(caAfter, caBefore) {
			t.Errorf("%s after the restart: not the CA from before (%v): the proxy's clients no longer trust it", f, err)
		}
	}
	after := create("after")

	// The raw watch ended with the proxy (drained here); reopened from the last version it
	// had, it has every event since: the ones while the proxy was down, and after.
	var ended []string
	for drained := false; !drained; {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				drained = true
				break
			}
			ended = append(ended, fmt.Sprintf("%s %s", ev.Type, describe(ev.Object)))
			if ev.Type == watch.Error {
				if s, _ := ev.Object.(*metav1.Status); s != nil && s.Code == http.StatusGone {
					t.Errorf("the watch through the proxy ended with a 410 at the proxy's restart: %s", describe(ev.Object))
				}
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("the watch through the proxy did not end with the proxy (events %v)", ended)
		}
	}
	t.Logf("the watch open through the proxy ended with it; its last events: %v", ended)
	reopened := time.Now()
	w, err = raw.CoreV1().ConfigMaps(ns).Watch(wctx, metav1.ListOptions{ResourceVersion: last})
	if err != nil {
		t.Fatalf("a watch from %s (its last event) through the restarted proxy: %v%s", last, err, requestsString(rawLog.since(reopened)))
	}
	wantRaw := []string{"ADDED while-down@" + down.ResourceVersion, "MODIFIED first@" + first.ResourceVersion, "ADDED after@" + after.ResourceVersion}
	if got := eventsString(collect(t, w, len(wantRaw), false, 30*time.Second, time.Second, "the watch from "+last+" through the restarted proxy")); strings.Join(got, ",") != strings.Join(wantRaw, ",") {
		t.Errorf("the watch from %s through the restarted proxy: %v, want %v", last, got, wantRaw)
	}
	for _, r := range rawLog.since(reopened) {
		if r.status != http.StatusOK || r.expired {
			t.Errorf("the watch from %s through the restarted proxy: %s", last, r)
		}
	}

	// The informer catches up without listing again.
	eventually(t, 45*time.Second, "the informer through the restarted proxy has the configmaps written upstream", func() error {
		for _, c := range []*corev1.ConfigMap{down, first, after} {
			if err := handled.at(c.Name, c.ResourceVersion); err != nil {
				return err
			}
		}
		return nil
	})
	t.Logf("the informer had every write %s after the proxy was ready", time.Since(ready).Round(time.Millisecond))
	var initial, watches []*request
	for _, r := range informerLog.since(restarted) {
		if r.initial() {
			initial = append(initial, r)
		} else if r.isWatch() {
			watches = append(watches, r)
		}
	}
	var startedWith []string
	for _, r := range informerBefore {
		if r.initial() {
			startedWith = append(startedWith, r.String())
		}
	}
	t.Logf("the informer started with %v; since the restart it made:%s", startedWith, requestsString(informerLog.since(restarted)))
	if len(initial) > 0 {
		t.Errorf("the informer listed again after the proxy's restart:%s", requestsString(initial))
	}
	served := false
	for _, r := range watches {
		if r.resourceVersion() == "" || r.resourceVersion() == "0" {
			t.Errorf("the informer watched again from no version: %s", r)
		}
		if r.status == http.StatusOK {
			served = true
		}
	}
	if !served {
		t.Errorf("no watch of the informer answered 200 after the restart:%s", requestsString(watches))
	}
	for _, r := range informerLog.since(time.Time{}) {
		if r.expired {
			t.Errorf("the informer had a 410 from the proxy: %s", r)
		}
	}
	// Not asserted: the watches from versions older than the restarted proxy's cache are the
	// upstream's until they end (the informer's within its timeoutSeconds, 5 to 10 minutes).
	upstream, scopes := upstreamWatches(t, e, "configmaps")
	t.Logf("after the restart, with the informer's watch and the reopened one open through the proxy: apiserver_longrunning_requests{resource=configmaps,verb=WATCH} at the upstream %v (%s)", upstream, scopes)
	watchErrsMu.Lock()
	if len(watchErrs) > 0 {
		t.Logf("the informer's watch errors: %v", watchErrs)
	}
	watchErrsMu.Unlock()
}
