package clientgo

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

const kubeProtobuf = "application/vnd.kubernetes.protobuf"

// TestProtobufCoreGroup: client-go with its protobuf content type, as kube-controller-manager and
// kube-scheduler run it, on the core group: create, get, update, list and watch.
//
// client-go names the format application/vnd.kubernetes.protobuf. The gateway's own name is
// application/vnd.svc.protobuf, and it accepts Kubernetes' name as an alias. That is right for
// the core group because /api/v1 is wire-identical: the same apiVersion "v1", the same kinds, the
// same field numbers in the same generated.proto, inside the same envelope (the 4-byte "k8s\0"
// magic and runtime.Unknown). A client that decodes kube-apiserver's protobuf decodes the
// gateway's byte for byte, so refusing the name would only break unchanged clients.
func TestProtobufCoreGroup(t *testing.T) {
	tg := getTarget(t)
	ctx := context.Background()
	ns := newNamespace(t, tg, "pb")

	cfg := rest.CopyConfig(tg.cfg)
	cfg.ContentType = kubeProtobuf
	cfg.AcceptContentTypes = kubeProtobuf + "," + "application/json"
	rec := &contentTypeRecorder{}
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		rec.next = rt
		return rec
	})
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	core := cs.CoreV1()

	sa, err := core.ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{
		ObjectMeta: metav1.ObjectMeta{Name: "pb-robot", Labels: map[string]string{"format": "protobuf"}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create ServiceAccount in protobuf: %v", err)
	}
	if sa.Name != "pb-robot" || sa.Labels["format"] != "protobuf" || sa.UID == "" {
		t.Fatalf("created ServiceAccount decoded wrong: %+v", sa.ObjectMeta)
	}
	_, err = core.Secrets(ns).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "pb-secret"},
		Data:       map[string][]byte{"bin": {0, 1, 2, 255}},
		Type:       corev1.SecretTypeOpaque,
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create Secret in protobuf: %v", err)
	}
	got, err := core.Secrets(ns).Get(ctx, "pb-secret", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get: %v", err)
	}
	if string(got.Data["bin"]) != string([]byte{0, 1, 2, 255}) || got.Type != corev1.SecretTypeOpaque {
		t.Fatalf("secret read back %v %q", got.Data, got.Type)
	}
	got.Labels = map[string]string{"updated": "yes"}
	if _, err := core.Secrets(ns).Update(ctx, got, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("update in protobuf: %v", err)
	}

	list, err := core.Secrets(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatalf("list: %v", err)
	}
	if len(list.Items) != 1 || list.ResourceVersion == "" {
		t.Fatalf("list: %d items, resourceVersion %q", len(list.Items), list.ResourceVersion)
	}
	nsList, err := core.Namespaces().List(ctx, metav1.ListOptions{LabelSelector: "interop=true", Limit: 2})
	if err != nil {
		t.Fatalf("list namespaces with limit: %v", err)
	}
	if len(nsList.Items) == 0 {
		t.Fatal("no namespaces listed")
	}

	w, err := core.Secrets(ns).Watch(ctx, metav1.ListOptions{ResourceVersion: list.ResourceVersion})
	if err != nil {
		t.Fatalf("watch: %v", err)
	}
	defer w.Stop()
	if _, err := core.Secrets(ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "pb-watched"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := core.Secrets(ns).Delete(ctx, "pb-secret", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	var seen []string
	timeout := time.After(15 * time.Second)
	for len(seen) < 2 {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				t.Fatalf("watch closed after %v", seen)
			}
			s, isSecret := ev.Object.(*corev1.Secret)
			if !isSecret {
				t.Fatalf("watch event %s %T %v", ev.Type, ev.Object, ev.Object)
			}
			seen = append(seen, string(ev.Type)+" "+s.Name)
		case <-timeout:
			t.Fatalf("watch events %v, want ADDED pb-watched and DELETED pb-secret", seen)
		}
	}
	if seen[0] != string(watch.Added)+" pb-watched" || seen[1] != string(watch.Deleted)+" pb-secret" {
		t.Fatalf("watch events %v", seen)
	}

	// Every answer above was protobuf, the watch stream included.
	for _, s := range rec.all() {
		if !strings.Contains(s, "-> "+kubeProtobuf) {
			t.Errorf("response not in protobuf: %s", s)
		}
	}
	if rec.count(kubeProtobuf+";stream=watch") != 1 {
		t.Errorf("watch response content types: %v", rec.all())
	}

	// Errors come back as a Status, in protobuf as kube-apiserver sends them, and client-go
	// decodes their reasons either way.
	t.Run("ErrorsInProtobuf", func(t *testing.T) {
		before := len(rec.all())
		if _, err := core.Secrets(ns).Get(ctx, "missing", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Fatalf("get of a missing secret: %v, want 404 NotFound", err)
		}
		_, err := core.ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "pb-robot"}}, metav1.CreateOptions{})
		if !apierrors.IsAlreadyExists(err) {
			t.Fatalf("second create: %v, want 409 AlreadyExists", err)
		}
		var notProto []string
		for _, s := range rec.all()[before:] {
			if !strings.Contains(s, "-> "+kubeProtobuf) {
				notProto = append(notProto, s)
			}
		}
		if len(notProto) == 2 && tg.suffix == "svc.io" && strings.HasSuffix(notProto[0], "-> application/json") {
			t.Skip("known difference: see FINDINGS.md #4 (error Status answered in JSON to a protobuf client)")
		}
		if len(notProto) > 0 {
			t.Fatalf("error answers not in protobuf: %v", notProto)
		}
	})
}
