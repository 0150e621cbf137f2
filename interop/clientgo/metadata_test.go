package clientgo

import (
	"context"
	"encoding/json"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/metadata/metadatainformer"
	"k8s.io/client-go/tools/cache"
)

// TestMetadataClient: client-go's metadata client and metadata informer, which the garbage
// collector, the namespace controller and quota use. It asks for PartialObjectMetadata
// (g=meta.k8s.io) and falls back to decoding the full object's metadata, so it must work
// either way; the test logs which one the server gave.
func TestMetadataClient(t *testing.T) {
	tg := getTarget(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ns := newNamespace(t, tg, "meta")
	for i := range 3 {
		createSecret(t, ctx, tg, ns, fmt.Sprintf("m-%d", i))
	}
	mc, err := metadata.NewForConfig(tg.cfg)
	if err != nil {
		t.Fatal(err)
	}
	secretsGVR := schema.GroupVersionResource{Version: "v1", Resource: "secrets"}
	res := mc.Resource(secretsGVR).Namespace(ns)

	list, err := res.List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatalf("metadata list: %v", err)
	}
	if len(list.Items) != 3 || list.Items[0].Name != "m-0" || list.Items[0].UID == "" || list.ResourceVersion == "" {
		t.Fatalf("metadata list: %d items, rv %q", len(list.Items), list.ResourceVersion)
	}
	one, err := res.Get(ctx, "m-1", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("metadata get: %v", err)
	}
	if one.Name != "m-1" || one.Namespace != ns {
		t.Fatalf("metadata get: %+v", one.ObjectMeta)
	}
	// Deleting through the metadata client (the garbage collector's way).
	if err := res.Delete(ctx, "m-2", metav1.DeleteOptions{}); err != nil {
		t.Fatalf("metadata delete: %v", err)
	}

	// The answers themselves: metadata alone, in meta.k8s.io/v1, and 406 for a list asked as
	// one object (and the other way round).
	t.Run("Representation", func(t *testing.T) {
		rc := tg.kube.CoreV1().RESTClient()
		raw := func(path, accept string) (map[string]any, int) {
			var code int
			body, _ := rc.Get().AbsPath(path).SetHeader("Accept", accept).Do(ctx).StatusCode(&code).Raw()
			var v map[string]any
			_ = json.Unmarshal(body, &v)
			return v, code
		}
		const asList = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
		const asOne = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"
		l, code := raw("/api/v1/namespaces/"+ns+"/secrets", asList)
		items, _ := l["items"].([]any)
		if code != 200 || l["kind"] != "PartialObjectMetadataList" || l["apiVersion"] != "meta.k8s.io/v1" || len(items) != 2 {
			t.Fatalf("list as PartialObjectMetadataList: %d %v", code, l)
		}
		item, _ := items[0].(map[string]any)
		if item["kind"] != "PartialObjectMetadata" || item["apiVersion"] != "meta.k8s.io/v1" || item["data"] != nil || item["type"] != nil {
			t.Errorf("list item %v", item)
		}
		o, code := raw("/api/v1/namespaces/"+ns+"/secrets/m-0", asOne)
		if md, _ := o["metadata"].(map[string]any); code != 200 || o["kind"] != "PartialObjectMetadata" || md["name"] != "m-0" || o["data"] != nil {
			t.Errorf("get as PartialObjectMetadata: %d %v", code, o)
		}
		if _, code := raw("/api/v1/namespaces/"+ns+"/secrets", asOne); code != 406 {
			t.Errorf("a list as PartialObjectMetadata: %d, want 406", code)
		}
		if _, code := raw("/api/v1/namespaces/"+ns+"/secrets/m-0", asList); code != 406 {
			t.Errorf("an object as PartialObjectMetadataList: %d, want 406", code)
		}
	})

	t.Run("Watch", func(t *testing.T) {
		w, err := res.Watch(ctx, metav1.ListOptions{ResourceVersion: list.ResourceVersion})
		if err != nil {
			t.Fatalf("metadata watch: %v", err)
		}
		defer w.Stop()
		createSecret(t, ctx, tg, ns, "m-watched")
		for {
			select {
			case ev := <-w.ResultChan():
				if ev.Type == watch.Error {
					t.Fatalf("metadata watch error %v", ev.Object)
				}
				p, ok := ev.Object.(*metav1.PartialObjectMetadata)
				if !ok {
					t.Fatalf("metadata watch event %s %T", ev.Type, ev.Object)
				}
				if ev.Type == watch.Added && p.Name == "m-watched" {
					return
				}
			case <-time.After(15 * time.Second):
				t.Fatal("no metadata watch event for m-watched")
			}
		}
	})

	t.Run("Informer", func(t *testing.T) {
		ictx, icancel := context.WithCancel(ctx)
		factory := metadatainformer.NewFilteredSharedInformerFactory(mc, 0, ns, nil)
		inf := factory.ForResource(secretsGVR).Informer()
		var watchErr atomic.Value
		_ = inf.SetWatchErrorHandlerWithContext(func(_ context.Context, _ *cache.Reflector, err error) {
			watchErr.Store(err.Error())
		})
		factory.Start(ictx.Done())
		defer func() {
			icancel()
			factory.Shutdown()
		}()
		if !cache.WaitForCacheSync(ictx.Done(), inf.HasSynced) {
			t.Fatal("metadata informer did not sync")
		}
		createSecret(t, ctx, tg, ns, "m-late")
		deadline := time.Now().Add(20 * time.Second)
		for {
			want, err := secretsState(ctx, tg, ns)
			if err != nil {
				t.Fatal(err)
			}
			diff := sameState(storeState(inf.GetStore()), want)
			if diff == nil {
				return
			}
			if time.Now().After(deadline) {
				msg, _ := watchErr.Load().(string)
				t.Fatalf("metadata informer did not converge: %v (last watch error: %s)", diff, msg)
			}
			time.Sleep(100 * time.Millisecond)
		}
	})
}

// TestDynamicInformerEvents: a dynamic shared informer on events.k8s.io/v1 (events.svc.io/v1),
// as generic controllers watch a resource they have no Go type for.
func TestDynamicInformerEvents(t *testing.T) {
	tg := getTarget(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ns := newNamespace(t, tg, "dynev")
	events := tg.dyn.Resource(tg.gvr("events", "events")).Namespace(ns)
	if _, err := events.Create(ctx, newEvent(tg, ns, "before", "Tested"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	factory := dynamicinformer.NewFilteredDynamicSharedInformerFactory(tg.dyn, 0, ns, nil)
	inf := factory.ForResource(tg.gvr("events", "events")).Informer()
	factory.Start(ctx.Done())
	defer func() {
		cancel()
		factory.Shutdown()
	}()
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		t.Fatal("dynamic informer did not sync")
	}
	if _, err := events.Create(ctx, newEvent(tg, ns, "after", "Tested"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := events.Delete(ctx, "before", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "dynamic informer converges", func() error {
		l, err := events.List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		return sameState(storeState(inf.GetStore()), listState(l.Items, func(o *unstructured.Unstructured) metav1.Object { return o }))
	})
	obj, ok, err := inf.GetStore().GetByKey(ns + "/after")
	if err != nil || !ok {
		t.Fatalf("event 'after' not in the informer: %v", err)
	}
	if got := obj.(*unstructured.Unstructured).GetAPIVersion(); got != tg.group("events")+"/v1" {
		t.Fatalf("informer's object apiVersion %q", got)
	}
}
