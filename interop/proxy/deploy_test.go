package proxy

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"sort"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/restmapper"
	"k8s.io/client-go/tools/clientcmd"
)

// TestDeployManifests checks what an operator deploys (deploy/proxy/) against the real
// kube-apiserver: every object is created by a server-side dry run with strict field
// validation (the namespace itself for real, as the others need it), and the node agents'
// kubeconfig loads.
func TestDeployManifests(t *testing.T) {
	e := getEnv(t)
	dir := filepath.Join("..", "..", "deploy", "proxy")
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests in %s: %v", dir, err)
	}
	sort.Strings(files)
	kube, err := kubernetes.NewForConfig(e.upstream)
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(e.upstream)
	if err != nil {
		t.Fatal(err)
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(kube.Discovery()))
	dryRun := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}, FieldValidation: "Strict"}
	objects := 0
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
		for {
			var obj unstructured.Unstructured
			if err := dec.Decode(&obj.Object); err != nil {
				if errors.Is(err, io.EOF) {
					break
				}
				t.Fatalf("%s: %v", f, err)
			}
			if len(obj.Object) == 0 {
				continue
			}
			objects++
			gvk := obj.GroupVersionKind()
			if gvk.Kind == "Namespace" {
				ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: obj.GetName()}}
				if _, err := kube.CoreV1().Namespaces().Create(ctx(t), ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
					t.Fatalf("%s: namespace %s: %v", f, obj.GetName(), err)
				}
				continue
			}
			m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
			if err != nil {
				t.Fatalf("%s: %s: %v", f, gvk, err)
			}
			var ri dynamic.ResourceInterface = dyn.Resource(m.Resource)
			if m.Scope.Name() == "namespace" {
				ri = dyn.Resource(m.Resource).Namespace(obj.GetNamespace())
			}
			if _, err := ri.Create(ctx(t), &obj, dryRun); err != nil {
				t.Errorf("%s: %s %s: %v", f, gvk.Kind, obj.GetName(), err)
			}
		}
	}
	if objects < 8 {
		t.Errorf("only %d objects in %s", objects, dir)
	}
	if _, err := clientcmd.LoadFromFile(filepath.Join(dir, "node-agent.kubeconfig")); err != nil {
		t.Errorf("node-agent.kubeconfig: %v", err)
	}
}
