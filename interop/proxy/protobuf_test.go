package proxy

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"

	"svc.io/interop/protoschema"
)

const protobufType = "application/vnd.kubernetes.protobuf"

// TestProtoSchemaIsCurrent: the schema the gateway encodes protobuf with is the one the
// k8s.io/api of this module describes (regenerate it with `go run ./cmd/protoschema`).
func TestProtoSchemaIsCurrent(t *testing.T) {
	var want bytes.Buffer
	if err := protoschema.Generate(&want); err != nil {
		t.Fatal(err)
	}
	have, err := os.ReadFile(filepath.Join("..", "..", "core", "src", "watch", "unstructured", "builtin.schema"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(have, want.Bytes()) {
		t.Fatal("core/src/watch/unstructured/builtin.schema is stale: run `go run ./cmd/protoschema > ../core/src/watch/unstructured/builtin.schema` in interop/")
	}
}

// field is the first field number n of a message, as bytes.
func field(msg []byte, n protowire.Number) ([]byte, bool) {
	for len(msg) > 0 {
		num, typ, l := protowire.ConsumeTag(msg)
		if l < 0 {
			return nil, false
		}
		msg = msg[l:]
		if typ != protowire.BytesType {
			l = protowire.ConsumeFieldValue(num, typ, msg)
			if l < 0 {
				return nil, false
			}
			msg = msg[l:]
			continue
		}
		v, l := protowire.ConsumeBytes(msg)
		if l < 0 {
			return nil, false
		}
		if num == n {
			return v, true
		}
		msg = msg[l:]
	}
	return nil, false
}

// repeated is every field n of a message.
func repeated(msg []byte, n protowire.Number) [][]byte {
	var out [][]byte
	for len(msg) > 0 {
		num, typ, l := protowire.ConsumeTag(msg)
		if l < 0 {
			return out
		}
		msg = msg[l:]
		l = protowire.ConsumeFieldValue(num, typ, msg)
		if l < 0 {
			return out
		}
		if num == n && typ == protowire.BytesType {
			v, _ := protowire.ConsumeBytes(msg)
			out = append(out, v)
		}
		msg = msg[l:]
	}
	return out
}

// unwrap is the object message inside an enveloped body (`k8s\0` + runtime.Unknown).
func unwrap(body []byte) ([]byte, error) {
	if !bytes.HasPrefix(body, []byte("k8s\x00")) {
		return nil, fmt.Errorf("not a protobuf envelope: %q", body[:min(len(body), 40)])
	}
	raw, ok := field(body[4:], 2)
	if !ok {
		return nil, fmt.Errorf("an envelope without raw")
	}
	return raw, nil
}

// nameOf is an object message's metadata.name.
func nameOf(obj []byte) string {
	m, _ := field(obj, 1)
	n, _ := field(m, 1)
	return string(n)
}

// protobufItems lists a resource in protobuf through cfg: each item's message bytes by name.
func protobufItems(c context.Context, cfg *rest.Config, e *env, t *testing.T, path, rv string) (map[string][]byte, error) {
	pc := rest.CopyConfig(cfg)
	pc.ContentType = protobufType
	client := e.clients(t, pc).CoreV1().RESTClient()
	req := client.Get().AbsPath(path).SetHeader("Accept", protobufType)
	if rv != "" {
		req = req.Param("resourceVersion", rv)
	}
	var ct string
	body, err := req.Do(c).ContentType(&ct).Raw()
	if err != nil {
		return nil, err
	}
	if ct != protobufType {
		return nil, fmt.Errorf("answered in %q", ct)
	}
	list, err := unwrap(body)
	if err != nil {
		return nil, err
	}
	out := map[string][]byte{}
	for _, item := range repeated(list, 2) {
		out[nameOf(item)] = item
	}
	return out, nil
}

// sameDecoded says whether two object messages decode to equal Go objects of the kind of
// into (a difference in bytes that decodes alike is no difference to a client).
func sameDecoded(a, b []byte, into func() interface{ Unmarshal([]byte) error }) (bool, string) {
	x, y := into(), into()
	if err := x.Unmarshal(a); err != nil {
		return false, "the proxy's: " + err.Error()
	}
	if err := y.Unmarshal(b); err != nil {
		return false, "the upstream's: " + err.Error()
	}
	return reflect.DeepEqual(x, y), fmt.Sprintf("\n proxy:    %+v\n upstream: %+v", x, y)
}

// TestCacheProtobufMatchesUpstream: built-in kinds are served as protobuf from the cache
// (kubelets, kube-proxies and controllers ask for it), and each object is the upstream's own
// bytes: the same object, field for field, as kube-apiserver encodes it.
func TestCacheProtobufMatchesUpstream(t *testing.T) {
	e := getEnv(t)
	ns := namespace(t, e, "cache-protobuf")
	kube := e.clients(t, e.upstream)
	c := ctx(t)
	grace := int64(0)
	if _, err := kube.CoreV1().Pods(ns).Create(c, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "rich", Labels: map[string]string{"b": "2", "a": "1"},
			Annotations: map[string]string{"note": "ü"}},
		Spec: corev1.PodSpec{
			NodeName:                      "node-1",
			TerminationGracePeriodSeconds: &grace,
			Containers: []corev1.Container{{
				Name: "app", Image: "registry.k8s.io/pause:3.10", Args: []string{"-v", ""},
				Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}},
				Resources: corev1.ResourceRequirements{
					Limits:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("500m"), corev1.ResourceMemory: resource.MustParse("128Mi")},
					Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("0.1")},
				},
				ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/", Port: intstr.FromString("http")}}, PeriodSeconds: 7},
				LivenessProbe:  &corev1.Probe{ProbeHandler: corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt32(8080)}}},
			}},
			Volumes: []corev1.Volume{{Name: "cfg", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
				LocalObjectReference: corev1.LocalObjectReference{Name: "c"}}}}},
			Tolerations: []corev1.Toleration{{Key: "k", Operator: corev1.TolerationOpExists}},
		},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := kube.CoreV1().ConfigMaps(ns).Create(c, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "c"}, Data: map[string]string{"z": "1", "a": ""},
		BinaryData: map[string][]byte{"bin": {0, 1, 2, 255}, "empty": {}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := kube.CoreV1().ConfigMaps(ns).Create(c, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "bare"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	replicas := int32(2)
	if _, err := kube.AppsV1().Deployments(ns).Create(c, &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "d"},
		Spec: appsv1.DeploymentSpec{
			Replicas: &replicas,
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "d"},
				MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "tier", Operator: metav1.LabelSelectorOpIn, Values: []string{"a", "b"}}}},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "d", "tier": "a"}},
				Spec: corev1.PodSpec{Containers: pauseContainer()}},
		},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := kube.CoreV1().Services(ns).Create(c, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "s"},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "web", Port: 80, TargetPort: intstr.FromString("http")}},
			Selector: map[string]string{"app": "d"}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := kube.EventsV1().Events(ns).Create(c, &eventsv1.Event{
		ObjectMeta:          metav1.ObjectMeta{Name: "ev"},
		EventTime:           metav1.NewMicroTime(time.Date(2026, 11, 27, 6, 30, 0, 123456000, time.UTC)),
		Series:              &eventsv1.EventSeries{Count: 2, LastObservedTime: metav1.NewMicroTime(time.Date(2026, 11, 27, 6, 31, 0, 1000, time.UTC))},
		ReportingController: "example.com/c", ReportingInstance: "i", Action: "Test", Reason: "Testing",
		Regarding: corev1.ObjectReference{Kind: "Pod", Namespace: ns, Name: "rich"}, Type: "Normal",
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	kinds := []struct {
		group, resource, path string
		into                  func() interface{ Unmarshal([]byte) error }
	}{
		{"", "pods", "/api/v1/namespaces/" + ns + "/pods", func() interface{ Unmarshal([]byte) error } { return &corev1.Pod{} }},
		{"", "configmaps", "/api/v1/namespaces/" + ns + "/configmaps", func() interface{ Unmarshal([]byte) error } { return &corev1.ConfigMap{} }},
		{"", "services", "/api/v1/namespaces/" + ns + "/services", func() interface{ Unmarshal([]byte) error } { return &corev1.Service{} }},
		{"apps", "deployments", "/apis/apps/v1/namespaces/" + ns + "/deployments", func() interface{ Unmarshal([]byte) error } { return &appsv1.Deployment{} }},
		{"events.k8s.io", "events", "/apis/events.k8s.io/v1/namespaces/" + ns + "/events", func() interface{ Unmarshal([]byte) error } { return &eventsv1.Event{} }},
	}
	for _, k := range kinds {
		t.Run(k.resource, func(t *testing.T) {
			eventually(t, 20*time.Second, k.resource+": the proxy's protobuf list is the upstream's", func() error {
				before := cacheReads(t, e, k.group, k.resource, "list")
				p, err := protobufItems(c, e.proxy, e, t, k.path, "0")
				if err != nil {
					return fmt.Errorf("through the proxy: %w", err)
				}
				if cacheReads(t, e, k.group, k.resource, "list") <= before {
					return fmt.Errorf("not served from the proxy's cache")
				}
				d, err := protobufItems(c, e.upstream, e, t, k.path, "")
				if err != nil {
					return fmt.Errorf("from the upstream: %w", err)
				}
				if len(p) != len(d) || len(d) == 0 {
					return fmt.Errorf("%d items through the proxy, %d upstream", len(p), len(d))
				}
				var names []string
				for n := range d {
					names = append(names, n)
				}
				sort.Strings(names)
				for _, n := range names {
					if bytes.Equal(p[n], d[n]) {
						continue
					}
					same, diff := sameDecoded(p[n], d[n], k.into)
					if !same {
						return fmt.Errorf("%s differs when decoded:%s", n, diff)
					}
					// Equal when decoded: still say where the bytes part.
					i := 0
					for i < len(p[n]) && i < len(d[n]) && p[n][i] == d[n][i] {
						i++
					}
					return fmt.Errorf("%s: the same object, but not the same bytes from byte %d of %d/%d:\n proxy:    %x\n upstream: %x",
						n, i, len(p[n]), len(d[n]), p[n][i:min(len(p[n]), i+48)], d[n][i:min(len(d[n]), i+48)])
				}
				t.Logf("%s: %d objects, byte for byte the upstream's", k.resource, len(names))
				return nil
			})
		})
	}
}

// watchFrames reads a protobuf watch of path from rv: each event's type and object message.
func watchFrames(t *testing.T, c context.Context, e *env, cfg *rest.Config, path, rv string, n int) ([]string, [][]byte) {
	t.Helper()
	pc := rest.CopyConfig(cfg)
	pc.ContentType = protobufType
	client := e.clients(t, pc).CoreV1().RESTClient()
	c, cancel := context.WithTimeout(c, 15*time.Second)
	defer cancel()
	body, err := client.Get().AbsPath(path).Param("watch", "1").Param("resourceVersion", rv).
		SetHeader("Accept", protobufType+";stream=watch").Stream(c)
	if err != nil {
		t.Fatal(err)
	}
	defer body.Close()
	r := bufio.NewReader(body)
	var types []string
	var objects [][]byte
	for len(types) < n {
		var size [4]byte
		if _, err := io.ReadFull(r, size[:]); err != nil {
			t.Fatalf("after %d events: %v", len(types), err)
		}
		frame := make([]byte, binary.BigEndian.Uint32(size[:]))
		if _, err := io.ReadFull(r, frame); err != nil {
			t.Fatal(err)
		}
		ty, _ := field(frame, 1)
		ext, _ := field(frame, 2)
		raw, _ := field(ext, 1)
		obj, err := unwrap(raw)
		if err != nil {
			t.Fatal(err)
		}
		types = append(types, string(ty))
		objects = append(objects, obj)
	}
	return types, objects
}

// TestCacheProtobufWatch: a protobuf watch from the cache sends the upstream's events with
// the upstream's bytes.
func TestCacheProtobufWatch(t *testing.T) {
	e := getEnv(t)
	ns := namespace(t, e, "cache-protobuf-watch")
	kube := e.clients(t, e.upstream)
	c := ctx(t)
	cm, err := kube.CoreV1().ConfigMaps(ns).Create(c, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "w"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	rv := cm.ResourceVersion
	for i := range 3 {
		cm.Data = map[string]string{"i": fmt.Sprint(i)}
		if cm, err = kube.CoreV1().ConfigMaps(ns).Update(c, cm, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if err := kube.CoreV1().ConfigMaps(ns).Delete(c, "w", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	path := "/api/v1/namespaces/" + ns + "/configmaps"
	// The cache reaches the delete before the watch starts, so it has the history to send.
	eventually(t, 10*time.Second, "the proxy's cache sees the delete", func() error {
		items, err := protobufItems(c, e.proxy, e, t, path, "0")
		if err == nil && len(items) != 0 {
			err = fmt.Errorf("%d items", len(items))
		}
		return err
	})
	before := cacheReads(t, e, "", "configmaps", "watch")
	pTypes, pObjs := watchFrames(t, c, e, e.proxy, path, rv, 4)
	if cacheReads(t, e, "", "configmaps", "watch") <= before {
		t.Error("the protobuf watch was not served from the proxy's cache")
	}
	dTypes, dObjs := watchFrames(t, c, e, e.upstream, path, rv, 4)
	if strings.Join(pTypes, ",") != strings.Join(dTypes, ",") {
		t.Fatalf("event types: proxy %v, upstream %v", pTypes, dTypes)
	}
	for i := range dObjs {
		if !bytes.Equal(pObjs[i], dObjs[i]) {
			same, diff := sameDecoded(pObjs[i], dObjs[i], func() interface{ Unmarshal([]byte) error } { return &corev1.ConfigMap{} })
			t.Errorf("event %d (%s): not the upstream's bytes (same when decoded: %v)%s", i, dTypes[i], same, diff)
		}
	}
	t.Logf("%v: byte for byte the upstream's", pTypes)
}

// TestCacheProtobufEveryKind: every built-in resource the upstream holds objects of, listed
// cluster-wide in protobuf through the cache, is the upstream's bytes, object for object (those
// at the same resourceVersion on both sides); in JSON, the same values (items without
// apiVersion and kind, as kube-apiserver lists its built-in kinds).
func TestCacheProtobufEveryKind(t *testing.T) {
	e := getEnv(t)
	c := ctx(t)
	lists, err := e.clients(t, e.upstream).Discovery().ServerPreferredResources()
	if err != nil {
		t.Fatal(err)
	}
	compared, kinds := 0, 0
	for _, l := range lists {
		gv, err := schema.ParseGroupVersion(l.GroupVersion)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range l.APIResources {
			if strings.Contains(r.Name, "/") || !contains(r.Verbs, "list") || !contains(r.Verbs, "watch") ||
				!scheme.Scheme.Recognizes(gv.WithKind(r.Kind)) || !isCached(t, e, gv.Group, r.Name) {
				continue
			}
			path := "/apis/" + l.GroupVersion + "/" + r.Name
			if gv.Group == "" {
				path = "/api/v1/" + r.Name
			}
			before := cacheReads(t, e, gv.Group, r.Name, "list")
			p, err := protobufItems(c, e.proxy, e, t, path, "0")
			if err != nil {
				t.Errorf("%s through the proxy: %v", path, err)
				continue
			}
			if cacheReads(t, e, gv.Group, r.Name, "list") <= before {
				t.Errorf("%s: not served from the proxy's cache", path)
			}
			d, err := protobufItems(c, e.upstream, e, t, path, "")
			if err != nil {
				t.Fatal(err)
			}
			jp, err := jsonItems(c, e.proxy, e, t, path, "0")
			if err != nil {
				t.Errorf("%s through the proxy: %v", path, err)
				continue
			}
			jd, err := jsonItems(c, e.upstream, e, t, path, "")
			if err != nil {
				t.Fatal(err)
			}
			for name, want := range jd {
				if have, ok := jp[name]; ok && have["metadata"].(map[string]any)["resourceVersion"] == want["metadata"].(map[string]any)["resourceVersion"] && !reflect.DeepEqual(have, want) {
					t.Errorf("%s %s: not the upstream's JSON:\n proxy:    %v\n upstream: %v", path, name, have, want)
				}
			}
			n := 0
			for name, want := range d {
				have, ok := p[name]
				if !ok || rvOf(have) != rvOf(want) {
					continue // changed in between
				}
				n++
				if !bytes.Equal(have, want) {
					t.Errorf("%s %s: not the upstream's bytes:\n proxy:    %x\n upstream: %x", path, name, have, want)
				}
			}
			if n > 0 {
				kinds++
				compared += n
			}
		}
	}
	t.Logf("%d objects of %d kinds compared", compared, kinds)
	if kinds < 10 {
		t.Errorf("only %d kinds had objects to compare", kinds)
	}
}

// jsonItems lists a resource in JSON through cfg: each item by name.
func jsonItems(c context.Context, cfg *rest.Config, e *env, t *testing.T, path, rv string) (map[string]map[string]any, error) {
	req := e.clients(t, cfg).CoreV1().RESTClient().Get().AbsPath(path).SetHeader("Accept", "application/json")
	if rv != "" {
		req = req.Param("resourceVersion", rv)
	}
	body, err := req.Do(c).Raw()
	if err != nil {
		return nil, err
	}
	var list struct {
		Items []map[string]any `json:"items"`
	}
	if err := json.Unmarshal(body, &list); err != nil {
		return nil, err
	}
	out := map[string]map[string]any{}
	for _, item := range list.Items {
		out[item["metadata"].(map[string]any)["name"].(string)] = item
	}
	return out, nil
}

// rvOf is an object message's metadata.resourceVersion.
func rvOf(obj []byte) string {
	m, _ := field(obj, 1)
	rv, _ := field(m, 6)
	return string(rv)
}
