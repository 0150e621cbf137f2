package proxy

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sort"
	"sync"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The proxy's default --upstream-long-running-per-user: the long-running requests one user
// may have passed upstream at once.
const longRunningPerUser = 100

// A watch with no resourceVersion and no sendInitialEvents: passed through, not served from
// the proxy's cache, so long-running upstream.
const passThroughWatch = "/api/v1/namespaces/perm-a/configmaps?watch=1"

// heldWatch is one long-running request kept open until its context is cancelled.
type heldWatch struct {
	code   int
	header http.Header
	body   []byte // the answer of a refused one
	err    error
	done   chan struct{}
}

// openWatch sends a watch and, once its head is in (within 10 s), keeps reading it in the
// background until c is cancelled.
func openWatch(c context.Context, client *http.Client, url string) *heldWatch {
	w := &heldWatch{done: make(chan struct{})}
	c, cancel := context.WithCancel(c)
	req, err := http.NewRequestWithContext(c, http.MethodGet, url, nil)
	if err != nil {
		cancel()
		w.err = err
		close(w.done)
		return w
	}
	headTimeout := time.AfterFunc(10*time.Second, cancel)
	resp, err := client.Do(req)
	if !headTimeout.Stop() {
		if err == nil {
			_ = resp.Body.Close()
		}
		err = fmt.Errorf("no answer within 10 s")
	}
	if err != nil {
		cancel()
		w.err = err
		close(w.done)
		return w
	}
	w.code, w.header = resp.StatusCode, resp.Header
	if resp.StatusCode != http.StatusOK {
		w.body, _ = io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		_ = resp.Body.Close()
		cancel()
		close(w.done)
		return w
	}
	go func() {
		defer close(w.done)
		defer cancel()
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
	}()
	return w
}

func medianMax(ds []time.Duration) (median, max time.Duration) {
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2], s[len(s)-1]
}

func TestLongRunningIsolation(t *testing.T) {
	e := getEnv(t)
	setUpPerm(t, e)
	pc := newPermClients(t, e)
	kube := e.clients(t, e.upstream)
	reader := permUser(t, e, "perm-reader")
	other := permUser(t, e, "perm-other")
	getCM := permGet("/api/v1/namespaces/perm-a/configmaps/perm-cm1")
	permWaitFor(t, pc, other, false, getCM, 200)
	permWaitFor(t, pc, reader, false, permGet("/api/v1/namespaces/perm-a/configmaps"), 200)

	// A ServiceAccount whose every fresh token costs the proxy a TokenReview.
	_, err := kube.CoreV1().ServiceAccounts(permA).Create(ctx(t), &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "perm-iso"}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	freshToken := func() *permCred {
		tr, err := kube.CoreV1().ServiceAccounts(permA).CreateToken(ctx(t), "perm-iso", &authenticationv1.TokenRequest{
			Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr(int64(600))},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return &permCred{name: "perm-iso token", token: tr.Status.Token}
	}
	permWaitFor(t, pc, freshToken(), false, getCM, 200)
	// Every token over one connection of its own to the proxy (the connection is warm: only
	// the TokenReview is new).
	tokens := &permCred{name: "tokens"}
	tokenClient := &http.Client{Transport: pc.transport(tokens, true, false)}

	timed := func(c *permCred, client *http.Client) (time.Duration, error) {
		c2, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		req, err := http.NewRequestWithContext(c2, http.MethodGet, e.proxyURL+getCM.path, nil)
		if err != nil {
			return 0, err
		}
		if c.token != "" {
			req.Header.Set("Authorization", "Bearer "+c.token)
		}
		start := time.Now()
		resp, err := client.Do(req)
		if err != nil {
			return 0, err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		took := time.Since(start)
		if resp.StatusCode != http.StatusOK {
			return took, fmt.Errorf("%d", resp.StatusCode)
		}
		return took, nil
	}
	otherClient := &http.Client{Transport: pc.transport(other, true, false)}
	// 20 GETs of perm-other, and the first GET of 5 fresh tokens; the first failure (5 s
	// without an answer included) ends it.
	measure := func() (gets, firsts []time.Duration, err error) {
		if _, err := timed(other, otherClient); err != nil { // warms the connection
			return nil, nil, fmt.Errorf("perm-other's GET through the proxy: %v", err)
		}
		if _, err := timed(freshToken(), tokenClient); err != nil {
			return nil, nil, fmt.Errorf("a token's GET through the proxy: %v", err)
		}
		for range 20 {
			d, err := timed(other, otherClient)
			if err != nil {
				return nil, nil, fmt.Errorf("perm-other's GET through the proxy: %v", err)
			}
			gets = append(gets, d)
		}
		for range 5 {
			tok := freshToken()
			d, err := timed(tok, tokenClient)
			if err != nil {
				return nil, nil, fmt.Errorf("a fresh token's first GET through the proxy: %v", err)
			}
			firsts = append(firsts, d)
		}
		return gets, firsts, nil
	}
	getsBefore, firstsBefore, err := measure()
	if err != nil {
		t.Fatalf("baseline: %v", err)
	}
	bMed, bMax := medianMax(getsBefore)
	tbMed, tbMax := medianMax(firstsBefore)
	t.Logf("baseline: perm-other's GET through the proxy: median %v max %v; a fresh token's first GET: median %v max %v", bMed, bMax, tbMed, tbMax)

	// perm-reader holds as many pass-through watches as it may, over one h2 connection.
	wctx, stopWatches := context.WithCancel(context.Background())
	defer stopWatches()
	readerClient := &http.Client{Transport: pc.transport(reader, true, false)}
	watches := make([]*heldWatch, longRunningPerUser)
	var wg sync.WaitGroup
	for i := range watches {
		wg.Add(1)
		go func() {
			defer wg.Done()
			watches[i] = openWatch(wctx, readerClient, e.proxyURL+passThroughWatch)
		}()
	}
	wg.Wait()
	var held []*heldWatch
	var refused []string
	for i, w := range watches {
		if w.err != nil || w.code != http.StatusOK {
			refused = append(refused, fmt.Sprintf("watch %d: %v %d %.200s", i+1, w.err, w.code, w.body))
			continue
		}
		held = append(held, w)
	}
	if len(refused) > 0 {
		t.Errorf("%d of perm-reader's first %d watches through the proxy failed, e.g. %q", len(refused), longRunningPerUser, refused[:min(3, len(refused))])
	}
	t.Logf("perm-reader holds %d pass-through watches through the proxy", len(held))
	closeAll := func() {
		stopWatches()
		for _, w := range watches {
			<-w.done
		}
	}
	defer closeAll()

	// One more is past the limit: 429, a Status, Retry-After.
	extra := openWatch(wctx, readerClient, e.proxyURL+passThroughWatch)
	watches = append(watches, extra)
	if extra.err != nil || extra.code != http.StatusTooManyRequests {
		t.Errorf("watch %d of perm-reader: want 429, got %v %d", longRunningPerUser+1, extra.err, extra.code)
	} else {
		var st metav1.Status
		if err := json.Unmarshal(extra.body, &st); err != nil || st.Kind != "Status" || st.Code != 429 || st.Reason != metav1.StatusReasonTooManyRequests {
			t.Errorf("watch %d of perm-reader: want a Status of reason TooManyRequests, got %v: %.300s", longRunningPerUser+1, err, extra.body)
		}
		if extra.header.Get("Retry-After") == "" {
			t.Errorf("watch %d of perm-reader: 429 without Retry-After", longRunningPerUser+1)
		}
	}

	getsAfter, firstsAfter, err := measure()
	if err != nil {
		t.Errorf("with %d watches of perm-reader held: %v", len(held), err)
	} else {
		aMed, aMax := medianMax(getsAfter)
		taMed, taMax := medianMax(firstsAfter)
		t.Logf("perm-other's GET through the proxy: median %v max %v before, median %v max %v with %d watches of perm-reader held", bMed, bMax, aMed, aMax, len(held))
		t.Logf("a fresh token's first GET through the proxy: median %v max %v before, median %v max %v with %d watches of perm-reader held", tbMed, tbMax, taMed, taMax, len(held))
		bound := func(before time.Duration) time.Duration { return max(2*before, before+20*time.Millisecond) }
		if aMed > bound(bMed) {
			t.Errorf("perm-other's GETs slowed down by perm-reader's watches: median %v, was %v (bound %v)", aMed, bMed, bound(bMed))
		}
		if taMed > bound(tbMed) {
			t.Errorf("a fresh token's first GET slowed down by perm-reader's watches: median %v, was %v (bound %v)", taMed, tbMed, bound(tbMed))
		}
	}

	// Closed, the watches give their places back.
	closeAll()
	deadline := time.Now().Add(10 * time.Second)
	for {
		c2, cancel := context.WithCancel(context.Background())
		w := openWatch(c2, readerClient, e.proxyURL+passThroughWatch)
		cancel()
		<-w.done
		if w.err == nil && w.code == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("a new watch of perm-reader after closing the others: %v %d %.300s", w.err, w.code, w.body)
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func TestTokenRevocation(t *testing.T) {
	e := getEnv(t)
	setUpPerm(t, e)
	pc := newPermClients(t, e)
	kube := e.clients(t, e.upstream)
	const name = "perm-revoke"
	if err := kube.CoreV1().ServiceAccounts(permA).Delete(ctx(t), name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	if _, err := kube.CoreV1().ServiceAccounts(permA).Create(ctx(t), &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	tr, err := kube.CoreV1().ServiceAccounts(permA).CreateToken(ctx(t), name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr(int64(600))},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cred := &permCred{name: name, token: tr.Status.Token}
	list := permGet("/api/v1/namespaces/perm-a/configmaps")
	const every = 100 * time.Millisecond
	// kube-apiserver caches an accepted token for 10 s, and answers TokenReviews from that
	// cache. The direct request fills its entry now; the proxy's first review comes 8 s later
	// and gets that entry's answer, which a proxy keeping answers 10 s would honour until 18 s
	// from now, 8 s after kube-apiserver itself stops.
	permWaitFor(t, pc, cred, false, list, 200)
	time.Sleep(8 * time.Second)
	permWaitFor(t, pc, cred, true, list, 200)

	deleted := time.Now()
	if err := kube.CoreV1().ServiceAccounts(permA).Delete(ctx(t), name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	// Each side polled until it has answered 401 for 1.5 s on end, for at most 30 s.
	type side struct {
		first    time.Duration // since the delete, when the first 401 came back; -1: never 401
		accepted time.Duration // since the delete, when the last 200 was sent; -1: none
		after    []string      // answers other than 401 after the first 401
	}
	poll := func(proxy bool) side {
		s := side{first: -1, accepted: -1}
		for time.Since(deleted) < 30*time.Second {
			sent := time.Since(deleted)
			a := pc.do(context.Background(), cred, proxy, false, list)
			at := time.Since(deleted)
			if a.err == nil && a.code == http.StatusOK {
				s.accepted = sent
			}
			if a.err == nil && a.code == http.StatusUnauthorized {
				if s.first < 0 {
					s.first = at
				}
				if at-s.first > 1500*time.Millisecond {
					break
				}
			} else if s.first >= 0 {
				s.after = append(s.after, fmt.Sprintf("%s at %v", a, at.Round(time.Millisecond)))
			}
			time.Sleep(every)
		}
		return s
	}
	var direct, proxied side
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); direct = poll(false) }()
	go func() { defer wg.Done(); proxied = poll(true) }()
	wg.Wait()
	t.Logf("the deleted ServiceAccount's token is refused (401) %v after the delete upstream, %v through the proxy; the last request accepted through the proxy was sent at %v", direct.first.Round(time.Millisecond), proxied.first.Round(time.Millisecond), proxied.accepted.Round(time.Millisecond))
	if direct.first < 0 {
		t.Fatal("the upstream still accepts the deleted ServiceAccount's token after 30 s")
	}
	if proxied.first < 0 {
		t.Fatal("the proxy still accepts the deleted ServiceAccount's token after 30 s")
	}
	if len(direct.after) > 0 || len(proxied.after) > 0 {
		t.Errorf("the token is accepted again after a 401: upstream %v, proxy %v", direct.after, proxied.after)
	}
	// The proxy's TokenReview cache keeps an answer 1 s from when it asked. Its last "accepted"
	// was asked before the upstream's first 401 came back, so no request sent 1 s after that
	// 401 may be accepted. (When the proxy's first 401 comes back is no measure of its cache:
	// it adds a poll's spacing, the forwarded list and the fresh review's round trip.)
	if proxied.accepted >= direct.first+time.Second {
		t.Errorf("the proxy accepted the deleted ServiceAccount's token in a request sent %v after the upstream's first 401 (its answers are kept at most 1 s)", proxied.accepted-direct.first)
	}
}
