package clientgo

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/kube-openapi/pkg/util/proto"
	"k8s.io/kube-openapi/pkg/util/proto/validation"
)

// TestOpenAPIV2 reads /openapi/v2 the way kubectl does when a kind has no PATCH operation in
// /openapi/v3 (a TokenReview is only created): client-go's OpenAPISchema asks for gnostic's
// protobuf, kube-openapi builds its models from it, and kubectl validates an object against
// the kind's model on the client.
func TestOpenAPIV2(t *testing.T) {
	tg := getTarget(t)
	doc, err := tg.kube.Discovery().OpenAPISchema()
	if err != nil {
		t.Fatalf("OpenAPISchema: %v", err)
	}
	if doc.GetSwagger() != "2.0" {
		t.Fatalf("swagger = %q, want 2.0", doc.GetSwagger())
	}
	models, err := proto.NewOpenAPIData(doc)
	if err != nil {
		t.Fatalf("kube-openapi could not read the document: %v", err)
	}
	for _, gvk := range []schema.GroupVersionKind{
		{Group: tg.group("authentication"), Version: "v1", Kind: "TokenReview"},
		{Version: "v1", Kind: "ServiceAccount"},
		{Version: "v1", Kind: "Namespace"},
		{Group: tg.group("events"), Version: "v1", Kind: "Event"},
	} {
		model := lookupResource(models, gvk)
		if model == nil {
			t.Errorf("no model for %v", gvk)
			continue
		}
		if gvk.Kind != "TokenReview" {
			continue
		}
		good := map[string]any{
			"apiVersion": gvk.GroupVersion().String(), "kind": gvk.Kind,
			"spec": map[string]any{"token": "x", "audiences": []any{"a"}},
		}
		if errs := validation.ValidateModel(good, model, gvk.Kind); len(errs) != 0 {
			t.Errorf("a valid TokenReview fails the model: %v", errs)
		}
		bad := map[string]any{
			"apiVersion": gvk.GroupVersion().String(), "kind": gvk.Kind,
			"spec": map[string]any{"token": "x", "bogus": int64(1)},
		}
		if errs := validation.ValidateModel(bad, model, gvk.Kind); len(errs) == 0 {
			t.Errorf("an unknown field passes the TokenReview model")
		}
	}
	// A path with the TokenReview's create operation, and no PATCH for it.
	found := false
	for _, p := range doc.GetPaths().GetPath() {
		if post := p.GetValue().GetPost(); post != nil {
			for _, ext := range post.GetVendorExtension() {
				if ext.GetName() == "x-kubernetes-group-version-kind" && strings.Contains(ext.GetValue().GetYaml(), "TokenReview") {
					found = true
				}
			}
		}
	}
	if !found {
		t.Errorf("no POST operation for TokenReview in /openapi/v2")
	}
}

// lookupResource finds the model whose x-kubernetes-group-version-kind names gvk, as kubectl's
// openapi.Resources does.
func lookupResource(models proto.Models, gvk schema.GroupVersionKind) proto.Schema {
	for _, name := range models.ListModels() {
		m := models.LookupModel(name)
		list, _ := m.GetExtensions()["x-kubernetes-group-version-kind"].([]any)
		for _, item := range list {
			g, _ := item.(map[any]any)
			if g["group"] == gvk.Group && g["version"] == gvk.Version && g["kind"] == gvk.Kind {
				return m
			}
		}
	}
	return nil
}
