package diff

import (
	"bytes"
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
	mrand "math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// A step is one request, sent to both servers; it is one test case. Every string field is a
// template: {{name}} is replaced by a variable (see scenarioVars, and save below). In query,
// variables are URL-escaped.
type step struct {
	name   string // the case name, unique within its scenario
	method string // GET when empty
	path   string
	query  string // raw query, e.g. "limit=2&labelSelector=a%3Db"
	ct     string // Content-Type; application/json when a body is set and ct is empty
	accept string // Accept; application/json when empty
	body   string
	// code is the status code kube-apiserver must answer (0: not checked); it proves the
	// step tests what it means to test.
	code int
	// watch reads the answer as a watch stream (see watchOpts).
	watch *watchOpts
	// save stores values of the raw JSON answer (dotted paths, [i] for array items) in
	// variables, per server, for later steps.
	save map[string]string
	// sleep waits before the request (on both servers).
	sleep time.Duration
	// codeOnly compares the status code alone (setup steps whose body is compared elsewhere).
	codeOnly bool
}

// watchOpts: a watch step reads events until it has `events` of them or `wait` passes.
type watchOpts struct {
	events int
	wait   time.Duration // default 5 s
	// keepBookmarks keeps every BOOKMARK; by default only the initial-events-end bookmark of a
	// streaming list is kept, as the spec guarantees no bookmark interval.
	keepBookmarks bool
	// during are sent once both watches are open, before the events are read; their answers
	// are compared as part of this case (paths during[i].*).
	during []step
}

type scenario struct {
	name  string
	steps []step
	// noNamespace: the scenario creates no namespace of its own ({{ns}} is still set).
	noNamespace bool
}

// server is one API server under test.
type server struct {
	name   string // kube or gateway
	suffix string // k8s.io or svc.io
	base   string
	client *http.Client
}

func newServer(t *testing.T, name, suffix, kubeconfig string) *server {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatalf("%s: kubeconfig %s: %v", name, kubeconfig, err)
	}
	client, err := rest.HTTPClientFor(cfg)
	if err != nil {
		t.Fatalf("%s: http client: %v", name, err)
	}
	return &server{name: name, suffix: suffix, base: strings.TrimRight(cfg.Host, "/"), client: client}
}

// groups maps the first label of each named group the runner uses to a variable.
var groups = []string{"events", "certificates", "authentication", "admissionregistration", "meta"}

// gatewayGroup matches the gateway's names for Kubernetes' named groups.
var gatewayGroup = regexp.MustCompile(`\b(events|certificates|authentication|admissionregistration|meta)\.svc\.io\b`)

// answer is what one server said to one request.
type answer struct {
	code   int
	header http.Header
	raw    []byte
	body   any   // decoded JSON, or the text when not JSON
	events []any // watch events, in order
}

// state is one server's variables and resource-version tokens within one scenario.
type state struct {
	srv  *server
	vars map[string]string
	rvs  map[string]string
	// reqRV is the resourceVersion query parameter of the answer being normalised.
	reqRV string
}

var varRef = regexp.MustCompile(`\{\{([A-Za-z0-9_]+)\}\}`)

func (st *state) expand(t *testing.T, tmpl string, escape bool) string {
	return varRef.ReplaceAllStringFunc(tmpl, func(m string) string {
		name := m[2 : len(m)-2]
		v, ok := st.vars[name]
		if !ok {
			t.Fatalf("%s: template %q: no variable %q", st.srv.name, tmpl, name)
		}
		if escape {
			return url.QueryEscape(v)
		}
		return v
	})
}

func (st *state) request(ctx context.Context, t *testing.T, s step) (*http.Request, error) {
	method := s.method
	if method == "" {
		method = http.MethodGet
	}
	u := st.srv.base + st.expand(t, s.path, false)
	if s.query != "" {
		u += "?" + st.expand(t, s.query, true)
	}
	var body io.Reader
	if s.body != "" {
		body = strings.NewReader(st.expand(t, s.body, false))
	}
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return nil, err
	}
	accept := s.accept
	if accept == "" {
		accept = "application/json"
	}
	req.Header.Set("Accept", st.expand(t, accept, false))
	req.Header.Set("User-Agent", "diff-runner/v1")
	if s.body != "" {
		ct := s.ct
		if ct == "" {
			ct = "application/json"
		}
		req.Header.Set("Content-Type", ct)
	}
	return req, nil
}

// requestedRV is the resourceVersion query parameter of s, expanded.
func (st *state) requestedRV(t *testing.T, s step) string {
	q, err := url.ParseQuery(st.expand(t, s.query, true))
	if err != nil {
		return ""
	}
	return q.Get("resourceVersion")
}

// do sends a plain (non-watch) request.
func (st *state) do(t *testing.T, s step) (*answer, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, err := st.request(ctx, t, s)
	if err != nil {
		return nil, err
	}
	resp, err := st.srv.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	a := &answer{code: resp.StatusCode, header: resp.Header, raw: raw}
	var v any
	if json.Unmarshal(raw, &v) == nil {
		a.body = v
	} else {
		a.body = string(raw)
	}
	return a, nil
}

// openWatch sends a watch request; events arrive on the returned answer's channel.
type watchStream struct {
	ans    *answer
	err    error
	opened chan struct{}
	mu     sync.Mutex
	events []any
	more   chan struct{}
	done   chan struct{}
	cancel context.CancelFunc
}

func (st *state) openWatch(t *testing.T, s step) *watchStream {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	w := &watchStream{opened: make(chan struct{}), more: make(chan struct{}, 1), done: make(chan struct{}), cancel: cancel}
	req, err := st.request(ctx, t, s)
	go func() {
		defer close(w.done)
		if err != nil {
			w.err = err
			close(w.opened)
			return
		}
		resp, err := st.srv.client.Do(req)
		if err != nil {
			w.err = err
			close(w.opened)
			return
		}
		defer resp.Body.Close()
		w.ans = &answer{code: resp.StatusCode, header: resp.Header}
		close(w.opened)
		if resp.StatusCode != http.StatusOK {
			raw, _ := io.ReadAll(resp.Body)
			w.ans.raw = raw
			var v any
			if json.Unmarshal(raw, &v) == nil {
				w.ans.body = v
			} else {
				w.ans.body = string(raw)
			}
			return
		}
		dec := json.NewDecoder(resp.Body)
		for {
			var ev any
			if err := dec.Decode(&ev); err != nil {
				return
			}
			w.mu.Lock()
			w.events = append(w.events, ev)
			w.mu.Unlock()
			select {
			case w.more <- struct{}{}:
			default:
			}
		}
	}()
	return w
}

// collect waits for n kept events or the deadline, then ends the watch.
func (w *watchStream) collect(o *watchOpts) (*answer, error) {
	wait := o.wait
	if wait == 0 {
		wait = 5 * time.Second
	}
	deadline := time.After(wait)
	defer func() {
		w.cancel()
		<-w.done
	}()
	<-w.opened
	if w.err != nil {
		return nil, w.err
	}
	for {
		w.mu.Lock()
		kept := keptEvents(w.events, o.keepBookmarks)
		w.mu.Unlock()
		if len(kept) >= o.events && o.events > 0 {
			w.ans.events = kept
			return w.ans, nil
		}
		select {
		case <-w.more:
		case <-w.done:
			w.mu.Lock()
			w.ans.events = keptEvents(w.events, o.keepBookmarks)
			w.mu.Unlock()
			return w.ans, nil
		case <-deadline:
			w.mu.Lock()
			w.ans.events = keptEvents(w.events, o.keepBookmarks)
			w.mu.Unlock()
			return w.ans, nil
		}
	}
}

func keptEvents(evs []any, keepBookmarks bool) []any {
	var out []any
	for _, ev := range evs {
		if !keepBookmarks && isPeriodicBookmark(ev) {
			continue
		}
		out = append(out, ev)
	}
	return out
}

func isPeriodicBookmark(ev any) bool {
	m, _ := ev.(map[string]any)
	if m == nil || m["type"] != "BOOKMARK" {
		return false
	}
	ann, _ := lookup(m, "object.metadata.annotations").(map[string]any)
	return ann["k8s.io/initial-events-end"] != "true"
}

// lookup reads a dotted path ("items[0].metadata.name") out of decoded JSON.
func lookup(v any, path string) any {
	for _, part := range strings.Split(path, ".") {
		name, idx, hasIdx := strings.Cut(part, "[")
		if name != "" {
			m, ok := v.(map[string]any)
			if !ok {
				return nil
			}
			v = m[name]
		}
		for hasIdx {
			var i int
			var rest string
			if _, err := fmt.Sscanf(idx, "%d]", &i); err != nil {
				return nil
			}
			a, ok := v.([]any)
			if !ok || i < 0 || i >= len(a) {
				return nil
			}
			v = a[i]
			_, rest, hasIdx = strings.Cut(idx, "[")
			idx = rest
		}
	}
	return v
}

// env is what one whole run shares.
type env struct {
	kube, gw *server
	run      string
	csr      string // a base64 CSR PEM, the same for both servers
	exp      *explanations
	verbose  bool
	// reportTo, when set (INTEROP_DIFF_REPORT), gets one line per unexplained difference:
	// case, path, kube-apiserver's value, the gateway's (tab-separated).
	reportMu sync.Mutex
	reportTo *os.File
}

func (e *env) report(caseName string, d difference) {
	if e.reportTo == nil {
		return
	}
	e.reportMu.Lock()
	defer e.reportMu.Unlock()
	clip := func(s string) string {
		if len(s) > 300 {
			return s[:300] + "…"
		}
		return s
	}
	fmt.Fprintf(e.reportTo, "%s\t%s\t%s\t%s\n", caseName, d.path, clip(d.kube), clip(d.gate))
}

func TestDiff(t *testing.T) {
	kk, gk := os.Getenv("INTEROP_DIFF_KUBE_KUBECONFIG"), os.Getenv("INTEROP_DIFF_GATEWAY_KUBECONFIG")
	if kk == "" || gk == "" {
		t.Skip("INTEROP_DIFF_KUBE_KUBECONFIG and INTEROP_DIFF_GATEWAY_KUBECONFIG are not set (interop/run.sh sets them)")
	}
	suffix := os.Getenv("INTEROP_DIFF_GATEWAY_SUFFIX")
	if suffix == "" {
		suffix = "svc.io"
	}
	e := &env{
		kube:    newServer(t, "kube", "k8s.io", kk),
		gw:      newServer(t, "gateway", suffix, gk),
		run:     randSuffix(),
		csr:     newCSR(t),
		exp:     loadExplanations(t, "../DIFFERENCES.md"),
		verbose: os.Getenv("INTEROP_DIFF_VERBOSE") != "",
	}
	if path := os.Getenv("INTEROP_DIFF_REPORT"); path != "" {
		f, err := os.Create(path)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		e.reportTo = f
	}
	names := map[string]bool{}
	for i, sc := range scenarios() {
		if names[sc.name] {
			t.Fatalf("two scenarios named %q", sc.name)
		}
		names[sc.name] = true
		t.Run(sc.name, func(t *testing.T) { e.runScenario(t, i, sc) })
	}
	t.Run("explained", func(t *testing.T) { e.exp.checkAllSeen(t) })
}

func (e *env) vars(srv *server, ns string) map[string]string {
	v := map[string]string{"ns": ns, "run": e.run, "csr": e.csr}
	for _, g := range groups {
		v[g] = g + "." + srv.suffix
	}
	return v
}

func (e *env) runScenario(t *testing.T, idx int, sc scenario) {
	ns := fmt.Sprintf("diff-%s-%02d", e.run, idx)
	states := []*state{
		{srv: e.kube, vars: e.vars(e.kube, ns), rvs: map[string]string{}},
		{srv: e.gw, vars: e.vars(e.gw, ns), rvs: map[string]string{}},
	}
	if !sc.noNamespace {
		setup := step{method: "POST", path: "/api/v1/namespaces", body: `{"metadata":{"name":"{{ns}}","labels":{"diff-run":"{{run}}"}}}`}
		for _, st := range states {
			a, err := st.do(t, setup)
			if err != nil || a.code != http.StatusCreated {
				t.Fatalf("%s: create namespace %s: %v %v", st.srv.name, ns, err, a)
			}
		}
	}
	seen := map[string]bool{}
	for _, s := range sc.steps {
		if seen[s.name] || s.name == "" {
			t.Fatalf("scenario %s: step name %q empty or used twice", sc.name, s.name)
		}
		seen[s.name] = true
		caseName := sc.name + "/" + s.name
		ok := t.Run(s.name, func(t *testing.T) { e.runStep(t, caseName, states, s) })
		_ = ok
	}
}

// runStep sends one step to both servers (at the same time), normalises and compares.
func (e *env) runStep(t *testing.T, caseName string, states []*state, s step) {
	if s.sleep > 0 {
		time.Sleep(s.sleep)
	}
	answers := make([]*answer, len(states))
	errs := make([]error, len(states))
	duringAnswers := make([][]*answer, len(states))
	if s.watch != nil {
		streams := make([]*watchStream, len(states))
		for i, st := range states {
			streams[i] = st.openWatch(t, s)
		}
		for _, w := range streams {
			select {
			case <-w.opened:
			case <-time.After(3 * time.Second):
			}
		}
		for _, d := range s.watch.during {
			as, es := e.both(t, states, d)
			for i := range states {
				if es[i] != nil {
					t.Fatalf("%s: during %s: %v", states[i].srv.name, d.name, es[i])
				}
				duringAnswers[i] = append(duringAnswers[i], as[i])
			}
		}
		var wg sync.WaitGroup
		for i := range states {
			wg.Add(1)
			go func() {
				defer wg.Done()
				answers[i], errs[i] = streams[i].collect(s.watch)
			}()
		}
		wg.Wait()
	} else {
		answers, errs = e.both(t, states, s)
	}
	for i, st := range states {
		if errs[i] != nil {
			t.Fatalf("%s: %v", st.srv.name, errs[i])
		}
	}
	if s.code != 0 && answers[0].code != s.code {
		t.Errorf("kube-apiserver answered %d, the scenario expects %d (the step is wrong): %s", answers[0].code, s.code, answers[0].raw)
	}
	// Save variables from the raw answers.
	for i, st := range states {
		for name, path := range s.save {
			v := lookup(answers[i].body, path)
			if v == nil {
				t.Errorf("%s: save %s: nothing at %s in %s", st.srv.name, name, path, answers[i].raw)
				continue
			}
			st.vars[name] = fmt.Sprint(v)
		}
	}
	flat := make([]map[string]string, len(states))
	for i, st := range states {
		n := st.normalise(answers[i], s.codeOnly, st.requestedRV(t, s))
		for j, d := range duringAnswers[i] {
			n[fmt.Sprintf("during[%d]", j)] = st.normalise(d, s.watch.during[j].codeOnly, "")
		}
		flat[i] = map[string]string{}
		flatten(flat[i], "", n)
		if e.verbose {
			js, _ := json.MarshalIndent(n, "", "  ")
			t.Logf("%s answer:\n%s", st.srv.name, js)
		}
	}
	diffs := compare(flat[0], flat[1])
	var unexplained []string
	for _, d := range diffs {
		if id := e.exp.explain(caseName, d.path); id != "" {
			t.Logf("explained (%s): %s", id, d)
			continue
		}
		unexplained = append(unexplained, d.String())
		e.report(caseName, d)
	}
	e.exp.markRan(caseName)
	if len(unexplained) > 0 {
		req := fmt.Sprintf("%s %s", orDefault(s.method, "GET"), states[0].expand(t, s.path, false))
		if s.query != "" {
			req += "?" + states[0].expand(t, s.query, true)
		}
		t.Errorf("%s: %d unexplained difference(s) (kube-apiserver, then gateway):\n  %s", req, len(unexplained), strings.Join(unexplained, "\n  "))
	}
}

func orDefault(s, d string) string {
	if s == "" {
		return d
	}
	return s
}

// both sends a plain request to every server at once.
func (e *env) both(t *testing.T, states []*state, s step) ([]*answer, []error) {
	answers := make([]*answer, len(states))
	errs := make([]error, len(states))
	var wg sync.WaitGroup
	for i, st := range states {
		wg.Add(1)
		go func() {
			defer wg.Done()
			answers[i], errs[i] = st.do(t, s)
		}()
	}
	wg.Wait()
	return answers, errs
}

type difference struct {
	path       string
	kube, gate string
}

func (d difference) String() string {
	show := func(s string) string {
		if s == "" {
			return "(absent)"
		}
		return s
	}
	return fmt.Sprintf("%s: %s | %s", d.path, show(d.kube), show(d.gate))
}

func compare(a, b map[string]string) []difference {
	keys := map[string]bool{}
	for k := range a {
		keys[k] = true
	}
	for k := range b {
		keys[k] = true
	}
	var out []difference
	for k := range keys {
		if a[k] != b[k] && !underOneSided(a, b, k) {
			out = append(out, difference{path: k, kube: a[k], gate: b[k]})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].path < out[j].path })
	return out
}

// underOneSided: some ancestor of path is present in a or b only (that ancestor is the
// difference reported).
func underOneSided(a, b map[string]string, path string) bool {
	for i := len(path) - 1; i > 0; i-- {
		if path[i] != '.' && path[i] != '[' {
			continue
		}
		anc := path[:i]
		_, inA := a[anc]
		_, inB := b[anc]
		if inA != inB {
			return true
		}
	}
	return false
}

// flatten writes every leaf of v as path -> JSON text. Empty maps and arrays are leaves; a
// non-empty map or array is also written, as {…} or […], so that a subtree present on one
// side only is one difference (see compare).
func flatten(out map[string]string, prefix string, v any) {
	switch v := v.(type) {
	case map[string]any:
		if len(v) == 0 {
			out[prefix] = "{}"
			return
		}
		if prefix != "" {
			out[prefix] = "{…}"
		}
		for k, x := range v {
			key := k
			if strings.ContainsAny(k, ".[]") {
				key = fmt.Sprintf("[%q]", k)
			}
			p := key
			if prefix != "" {
				if strings.HasPrefix(key, "[") {
					p = prefix + key
				} else {
					p = prefix + "." + key
				}
			}
			flatten(out, p, x)
		}
	case []any:
		if len(v) == 0 {
			out[prefix] = "[]"
			return
		}
		out[prefix] = "[…]"
		for i, x := range v {
			flatten(out, fmt.Sprintf("%s[%d]", prefix, i), x)
		}
	default:
		js, _ := json.Marshal(v)
		out[prefix] = string(js)
	}
}

func randSuffix() string {
	const letters = "abcdefghijklmnopqrstuvwxyz0123456789"
	b := make([]byte, 5)
	for i := range b {
		b[i] = letters[mrand.IntN(len(letters))]
	}
	return string(b)
}

// newCSR makes one PEM certificate signing request, base64-encoded, for both servers.
func newCSR(t *testing.T) string {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		Subject: pkix.Name{CommonName: "diff-runner", Organization: []string{"diff"}},
	}, key)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := pem.Encode(&buf, &pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}); err != nil {
		t.Fatal(err)
	}
	return base64.StdEncoding.EncodeToString(buf.Bytes())
}
