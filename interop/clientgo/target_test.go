package clientgo

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// A target is one API server under test, described by the environment that interop/run.sh sets:
//
//	INTEROP_TARGET        a name for the logs (kube-apiserver, svc-gateway)
//	INTEROP_KUBECONFIG    its admin kubeconfig (system:masters)
//	INTEROP_GROUP_SUFFIX  k8s.io for Kubernetes, svc.io for the gateway: the gateway serves
//	                      events.svc.io/v1 where Kubernetes serves events.k8s.io/v1, and so on
//	                      for certificates and authentication. The core group (/api/v1) is the
//	                      same on both.
//	INTEROP_RESTART_CMD   a shell command that restarts the server with the same data and port
//	                      and returns once it is ready again
//
// Without INTEROP_KUBECONFIG every test is skipped, so `go test ./...` and `go vet ./...` work
// anywhere.
type target struct {
	name    string
	suffix  string
	restart string
	cfg     *rest.Config
	kube    kubernetes.Interface
	dyn     dynamic.Interface
}

var (
	targetOnce sync.Once
	theTarget  *target
	targetErr  error
)

func getTarget(t *testing.T) *target {
	t.Helper()
	path := os.Getenv("INTEROP_KUBECONFIG")
	if path == "" {
		t.Skip("INTEROP_KUBECONFIG is not set (interop/run.sh sets it)")
	}
	targetOnce.Do(func() {
		cfg, err := clientcmd.BuildConfigFromFlags("", path)
		if err != nil {
			targetErr = err
			return
		}
		cfg.QPS = 200
		cfg.Burst = 400
		cfg.Timeout = 30 * time.Second
		suffix := os.Getenv("INTEROP_GROUP_SUFFIX")
		if suffix == "" {
			suffix = "k8s.io"
		}
		tg := &target{
			name:    os.Getenv("INTEROP_TARGET"),
			suffix:  suffix,
			restart: os.Getenv("INTEROP_RESTART_CMD"),
			cfg:     cfg,
		}
		tg.kube, targetErr = kubernetes.NewForConfig(cfg)
		if targetErr != nil {
			return
		}
		tg.dyn, targetErr = dynamic.NewForConfig(cfg)
		theTarget = tg
	})
	if targetErr != nil {
		t.Fatalf("target: %v", targetErr)
	}
	return theTarget
}

// group maps a Kubernetes group's first label to this target's name for it:
// group("events") is events.k8s.io on kube-apiserver and events.svc.io on the gateway.
func (tg *target) group(first string) string { return first + "." + tg.suffix }

func (tg *target) gvr(first, resource string) schema.GroupVersionResource {
	return schema.GroupVersionResource{Group: tg.group(first), Version: "v1", Resource: resource}
}

// restartServer restarts the server through INTEROP_RESTART_CMD.
func (tg *target) restartServer(t *testing.T) {
	t.Helper()
	if tg.restart == "" {
		t.Fatal("INTEROP_RESTART_CMD is not set (interop/run.sh sets it)")
	}
	start := time.Now()
	cmd := exec.Command("bash", "-c", tg.restart)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("restart %q: %v\n%s", tg.restart, err, out)
	}
	t.Logf("%s restarted in %v", tg.name, time.Since(start).Round(time.Millisecond))
}

// newNamespace creates a namespace for one test and deletes it when the test ends.
// kube-apiserver alone (no controller-manager) leaves a deleted namespace Terminating; that
// is harmless here, every name is unique.
func newNamespace(t *testing.T, tg *target, prefix string) string {
	t.Helper()
	name := fmt.Sprintf("%s-%s", prefix, randSuffix())
	ctx := context.Background()
	_, err := tg.kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"interop": "true"}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create namespace %s: %v", name, err)
	}
	t.Cleanup(func() {
		err := tg.kube.CoreV1().Namespaces().Delete(context.Background(), name, metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			t.Logf("cleanup: delete namespace %s: %v", name, err)
		}
	})
	return name
}

func randSuffix() string {
	const letters = "abcdefghijklmnopqrstuvwxyz0123456789"
	b := make([]byte, 6)
	for i := range b {
		b[i] = letters[rand.IntN(len(letters))]
	}
	return string(b)
}

// eventually polls cond until it returns nil or the timeout passes, then fails with the last error.
func eventually(t *testing.T, timeout time.Duration, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var err error
	for {
		if err = cond(); err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not true after %v: %v", what, timeout, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// contentTypeRecorder records the Content-Type of every response it sees.
type contentTypeRecorder struct {
	next http.RoundTripper
	mu   sync.Mutex
	seen []string
}

func (r *contentTypeRecorder) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := r.next.RoundTrip(req)
	if err == nil {
		r.mu.Lock()
		r.seen = append(r.seen, req.Method+" "+req.URL.Path+" -> "+resp.Header.Get("Content-Type"))
		r.mu.Unlock()
	}
	return resp, err
}

func (r *contentTypeRecorder) all() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.seen...)
}

func (r *contentTypeRecorder) count(substr string) int {
	n := 0
	for _, s := range r.all() {
		if strings.Contains(s, substr) {
			n++
		}
	}
	return n
}
