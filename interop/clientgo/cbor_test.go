package clientgo

import (
	"bytes"
	"context"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	cbordirect "k8s.io/apimachinery/pkg/runtime/serializer/cbor/direct"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	applycorev1 "k8s.io/client-go/applyconfigurations/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// requestRecorder records each request's Content-Type and its response's Content-Type.
type requestRecorder struct {
	next http.RoundTripper
	mu   sync.Mutex
	seen []string
}

func (r *requestRecorder) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := r.next.RoundTrip(req)
	if err == nil {
		r.mu.Lock()
		r.seen = append(r.seen, req.Method+" "+req.URL.Path+" ["+req.Header.Get("Content-Type")+"] -> "+
			resp.Status+" "+resp.Header.Get("Content-Type"))
		r.mu.Unlock()
	}
	return resp, err
}

func (r *requestRecorder) all() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.seen...)
}

// TestCBORCoreGroup: client-go speaking CBOR (ClientsAllowCBOR, ContentType application/cbor)
// on the core group, both servers with the alpha gate CBORServingAndStorage on: create, get,
// list, watch (application/cbor-seq) and server-side apply (application/apply-patch+cbor).
// client-go silently falls back to JSON after a 415, so every exchange's content types are
// checked.
func TestCBORCoreGroup(t *testing.T) {
	tg := getTarget(t)
	ctx := context.Background()
	ns := newNamespace(t, tg, "cbor")
	cfg := rest.CopyConfig(tg.cfg)
	cfg.ContentType = "application/cbor"
	cfg.AcceptContentTypes = "application/cbor"
	rec := &requestRecorder{}
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		rec.next = rt
		return rec
	})
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	core := cs.CoreV1()
	// kube-apiserver's and client-go's CBOR writes every string, field names included, as a
	// CBOR byte string (major type 2), not a text string; a decoder must take both.
	t.Run("Create", func(t *testing.T) {
		before := len(rec.all())
		_, err := core.ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "created"}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("create in CBOR: %v", err)
		}
		for _, s := range rec.all()[before:] {
			if !strings.Contains(s, "[application/cbor] -> 201") || !strings.HasSuffix(s, " application/cbor") {
				t.Errorf("exchange not in CBOR: %s", s)
			}
		}
	})

	// A Secret's data is []byte: client-go writes it as a byte string tagged 22 (expected
	// base64), and reads it back from the server's CBOR answer.
	t.Run("SecretData", func(t *testing.T) {
		want := []byte{0x00, 0xff, 'k'}
		_, err := core.Secrets(ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "bytes"},
			Data: map[string][]byte{"k": want}, StringData: map[string]string{"s": "plain"}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("create in CBOR: %v", err)
		}
		got, err := core.Secrets(ns).Get(ctx, "bytes", metav1.GetOptions{})
		if err != nil {
			t.Fatalf("get in CBOR: %v", err)
		}
		viaJSON, err := tg.kube.CoreV1().Secrets(ns).Get(ctx, "bytes", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for name, s := range map[string]*corev1.Secret{"CBOR": got, "JSON": viaJSON} {
			if !bytes.Equal(s.Data["k"], want) || string(s.Data["s"]) != "plain" {
				t.Errorf("read in %s: data %q, want k=%q s=plain", name, s.Data, want)
			}
		}
	})

	// Reads, lists and watches in CBOR; the writes go through the JSON client.
	t.Run("GetListWatch", func(t *testing.T) {
		before := len(rec.all())
		if _, err := tg.kube.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "c"}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		got, err := core.ServiceAccounts(ns).Get(ctx, "c", metav1.GetOptions{})
		if err != nil || got.Name != "c" || got.UID == "" {
			t.Fatalf("get in CBOR: %v %+v", err, got)
		}
		list, err := core.ServiceAccounts(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatalf("list in CBOR: %v", err)
		}
		w, err := core.ServiceAccounts(ns).Watch(ctx, metav1.ListOptions{ResourceVersion: list.ResourceVersion})
		if err != nil {
			t.Fatalf("watch in CBOR: %v", err)
		}
		defer w.Stop()
		if _, err := tg.kube.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "w"}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		// The gateway's namespace controller may add the namespace's `default`
		// ServiceAccount after the list: that event is decoded and checked too, then passed.
		deadline := time.After(15 * time.Second)
	events:
		for {
			select {
			case ev := <-w.ResultChan():
				sa, ok := ev.Object.(*corev1.ServiceAccount)
				if ev.Type != watch.Added || !ok || (sa.Name != "w" && sa.Name != "default") {
					t.Fatalf("CBOR watch event %s %v", ev.Type, ev.Object)
				}
				if sa.Name == "w" {
					break events
				}
			case <-deadline:
				t.Fatal("no CBOR watch event for w")
			}
		}
		for _, s := range rec.all()[before:] {
			if !strings.Contains(s, "-> 200") || !strings.Contains(s, " application/cbor") {
				t.Errorf("exchange not in CBOR: %s", s)
			}
		}
		if n := len(rec.all()[before:]); n != 3 {
			t.Errorf("%d CBOR exchanges, want get, list and watch: %v", n, rec.all()[before:])
		}
	})

	// client-go's typed Apply sends application/apply-patch+cbor only with ClientsPreferCBOR
	// on; the request is made here as client-go makes it then (util/apply.NewRequest).
	t.Run("ApplyCBOR", func(t *testing.T) {
		body, err := cbordirect.Marshal(applycorev1.ServiceAccount("applied", ns).WithLabels(map[string]string{"applied": "cbor"}))
		if err != nil {
			t.Fatal(err)
		}
		before := len(rec.all())
		out := &corev1.ServiceAccount{}
		err = core.RESTClient().Patch(types.ApplyCBORPatchType).Namespace(ns).Resource("serviceaccounts").Name("applied").
			Param("fieldManager", "cbor-applier").Body(body).Do(ctx).Into(out)
		exchanges := rec.all()[before:]
		if err != nil {
			t.Fatalf("apply in CBOR: %v (exchanges %v)", err, exchanges)
		}
		if out.Labels["applied"] != "cbor" {
			t.Fatalf("apply result labels %v", out.Labels)
		}
		if len(exchanges) != 1 || !strings.Contains(exchanges[0], "[application/apply-patch+cbor]") ||
			!strings.Contains(exchanges[0], " application/cbor") {
			t.Fatalf("apply exchanges %v, want one application/apply-patch+cbor request answered in CBOR", exchanges)
		}
	})
}
