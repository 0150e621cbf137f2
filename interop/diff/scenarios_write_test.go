package diff

import (
	"fmt"
	"strings"
)

const (
	jsonPatch  = "application/json-patch+json"
	mergePatch = "application/merge-patch+json"
	smPatch    = "application/strategic-merge-patch+json"
	applyYAML  = "application/apply-patch+yaml"
)

func writeScenarios() []scenario {
	return []scenario{
		fieldValidationScenario(),
		{name: "patch-types", steps: []step{
			{name: "setup", method: "POST", path: secrets, code: 201,
				body: `{"metadata":{"name":"p1","labels":{"a":"1"}},"data":{"k":"dg=="}}`,
				save: map[string]string{"rv1": "metadata.resourceVersion"}},
			{name: "json-patch", method: "PATCH", path: secrets + "/p1", ct: jsonPatch, code: 200,
				body: `[{"op":"replace","path":"/metadata/labels/a","value":"2"},{"op":"add","path":"/data/j","value":"dw=="}]`},
			{name: "json-patch-test-fails", method: "PATCH", path: secrets + "/p1", ct: jsonPatch, code: 422,
				body: `[{"op":"test","path":"/metadata/labels/a","value":"1"},{"op":"remove","path":"/data/j"}]`},
			{name: "json-patch-missing-path", method: "PATCH", path: secrets + "/p1", ct: jsonPatch, code: 422,
				body: `[{"op":"remove","path":"/metadata/labels/nothing"}]`},
			{name: "json-patch-not-array", method: "PATCH", path: secrets + "/p1", ct: jsonPatch, code: 400,
				body: `{"op":"remove","path":"/data/j"}`},
			{name: "json-patch-bad-op", method: "PATCH", path: secrets + "/p1", ct: jsonPatch, code: 422,
				body: `[{"op":"frobnicate","path":"/data/j"}]`},
			{name: "json-patch-stale-rv", method: "PATCH", path: secrets + "/p1", ct: jsonPatch, code: 409,
				body: `[{"op":"replace","path":"/metadata/resourceVersion","value":"{{rv1}}"},{"op":"remove","path":"/data/j"}]`},
			{name: "merge-patch", method: "PATCH", path: secrets + "/p1", ct: mergePatch, code: 200,
				body: `{"metadata":{"labels":{"a":null,"b":"1"}},"data":{"j":null}}`},
			{name: "merge-patch-stale-rv", method: "PATCH", path: secrets + "/p1", ct: mergePatch, code: 409,
				body: `{"metadata":{"resourceVersion":"{{rv1}}","labels":{"c":"1"}}}`},
			{name: "merge-patch-not-object", method: "PATCH", path: secrets + "/p1", ct: mergePatch, code: 400,
				body: `[1]`},
			{name: "merge-patch-invalid-result", method: "PATCH", path: secrets + "/p1", ct: mergePatch, code: 422,
				body: `{"metadata":{"labels":{"bad key!":"x"}}}`},
			{name: "merge-patch-missing", method: "PATCH", path: secrets + "/missing", ct: mergePatch, code: 404,
				body: `{"metadata":{"labels":{"c":"1"}}}`},
			{name: "merge-patch-rename", method: "PATCH", path: secrets + "/p1", ct: mergePatch, code: 400,
				body: `{"metadata":{"name":"p2"}}`},
			{name: "strategic-merge-patch", method: "PATCH", path: secrets + "/p1", ct: smPatch, code: 200,
				body: `{"metadata":{"labels":{"d":"1"}},"stringData":{"s":"v"}}`},
			{name: "unsupported-patch-type", method: "PATCH", path: secrets + "/p1", ct: "application/foo+json", code: 415,
				body: `{}`},
			{name: "sa-setup", method: "POST", path: sas, code: 201,
				body: `{"metadata":{"name":"psa"},"secrets":[{"name":"a"},{"name":"b"}],"imagePullSecrets":[{"name":"x"}]}`},
			{name: "sa-strategic-merge-by-name", method: "PATCH", path: sas + "/psa", ct: smPatch, code: 200,
				body: `{"secrets":[{"name":"c"}]}`},
			{name: "sa-strategic-delete-directive", method: "PATCH", path: sas + "/psa", ct: smPatch, code: 200,
				body: `{"secrets":[{"name":"a","$patch":"delete"}]}`},
			{name: "sa-strategic-set-order", method: "PATCH", path: sas + "/psa", ct: smPatch, code: 200,
				body: `{"$setElementOrder/secrets":[{"name":"c"},{"name":"b"}],"secrets":[{"name":"c"},{"name":"b"}]}`},
			{name: "sa-strategic-atomic-list", method: "PATCH", path: sas + "/psa", ct: smPatch, code: 200,
				body: `{"imagePullSecrets":[{"name":"y"}]}`},
			{name: "sa-merge-patch-replaces-list", method: "PATCH", path: sas + "/psa", ct: mergePatch, code: 200,
				body: `{"secrets":[{"name":"z"}]}`},
			{name: "sa-get", path: sas + "/psa", code: 200},
		}},
		{name: "apply", steps: []step{
			{name: "create", method: "PATCH", path: secrets + "/ap1", query: "fieldManager=m1", ct: applyYAML, code: 201,
				body: "apiVersion: v1\nkind: Secret\nmetadata:\n  name: ap1\n  labels:\n    a: \"1\"\n    shared: \"s\"\nstringData:\n  k: v\n",
				save: map[string]string{"rv1": "metadata.resourceVersion"}},
			{name: "reapply-unchanged", method: "PATCH", path: secrets + "/ap1", query: "fieldManager=m1", ct: applyYAML, code: 200,
				body: "apiVersion: v1\nkind: Secret\nmetadata:\n  name: ap1\n  labels:\n    a: \"1\"\n    shared: \"s\"\nstringData:\n  k: v\n"},
			{name: "shared-same-value", method: "PATCH", path: secrets + "/ap1", query: "fieldManager=m2", ct: applyYAML, code: 200,
				body: "apiVersion: v1\nkind: Secret\nmetadata:\n  name: ap1\n  labels:\n    shared: \"s\"\n    b: \"2\"\n"},
			{name: "conflict", method: "PATCH", path: secrets + "/ap1", query: "fieldManager=m2", ct: applyYAML, code: 409,
				body: "apiVersion: v1\nkind: Secret\nmetadata:\n  name: ap1\n  labels:\n    a: \"other\"\n"},
			{name: "conflict-two-fields", method: "PATCH", path: secrets + "/ap1", query: "fieldManager=m3", ct: applyYAML, code: 409,
				body: "apiVersion: v1\nkind: Secret\nmetadata:\n  name: ap1\n  labels:\n    a: \"x\"\n    shared: \"y\"\n"},
			{name: "force", method: "PATCH", path: secrets + "/ap1", query: "fieldManager=m2&force=true", ct: applyYAML, code: 200,
				body: "apiVersion: v1\nkind: Secret\nmetadata:\n  name: ap1\n  labels:\n    a: \"other\"\n    shared: \"s\"\n    b: \"2\"\n"},
			{name: "drop-field", method: "PATCH", path: secrets + "/ap1", query: "fieldManager=m1", ct: applyYAML, code: 200,
				body: "apiVersion: v1\nkind: Secret\nmetadata:\n  name: ap1\n  labels:\n    shared: \"s\"\n"},
			{name: "update-by-put", method: "PUT", path: secrets + "/ap1", query: "fieldManager=putter", code: 200,
				body: `{"metadata":{"name":"ap1","labels":{"a":"other","shared":"s","b":"2","put":"1"}},"data":{"k":"dg=="}}`},
			{name: "update-by-merge-patch", method: "PATCH", path: secrets + "/ap1", query: "fieldManager=patcher", ct: mergePatch, code: 200,
				body: `{"metadata":{"labels":{"patched":"1"}}}`},
			{name: "get-managed-fields", path: secrets + "/ap1", code: 200},
			{name: "no-field-manager", method: "PATCH", path: secrets + "/ap1", ct: applyYAML, code: 422,
				body: "apiVersion: v1\nkind: Secret\nmetadata:\n  name: ap1\n"},
			{name: "force-on-merge-patch", method: "PATCH", path: secrets + "/ap1", query: "fieldManager=m1&force=true", ct: mergePatch, code: 422,
				body: `{"metadata":{"labels":{"f":"1"}}}`},
			{name: "bad-yaml", method: "PATCH", path: secrets + "/ap1", query: "fieldManager=m1", ct: applyYAML, code: 400,
				body: "apiVersion: v1\nkind: Secret\nmetadata: [unclosed\n"},
			{name: "wrong-kind", method: "PATCH", path: secrets + "/ap1", query: "fieldManager=m1", ct: applyYAML, code: 400,
				body: "apiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: ap1\n"},
			{name: "no-kind", method: "PATCH", path: secrets + "/ap1", query: "fieldManager=m1", ct: applyYAML, code: 400,
				body: "metadata:\n  name: ap1\n"},
			{name: "name-mismatch", method: "PATCH", path: secrets + "/ap1", query: "fieldManager=m1", ct: applyYAML, code: 400,
				body: "apiVersion: v1\nkind: Secret\nmetadata:\n  name: other\n"},
			{name: "invalid-result", method: "PATCH", path: secrets + "/ap1", query: "fieldManager=m1", ct: applyYAML, code: 422,
				body: "apiVersion: v1\nkind: Secret\nmetadata:\n  name: ap1\n  labels:\n    \"bad key!\": x\n"},
			{name: "stale-rv", method: "PATCH", path: secrets + "/ap1", query: "fieldManager=m1", ct: applyYAML, code: 409,
				body: "apiVersion: v1\nkind: Secret\nmetadata:\n  name: ap1\n  resourceVersion: \"{{rv1}}\"\n"},
			{name: "json-body", method: "PATCH", path: secrets + "/ap2", query: "fieldManager=m1", ct: applyYAML, code: 201,
				body: `{"apiVersion":"v1","kind":"Secret","metadata":{"name":"ap2"},"type":"Opaque"}`},
			{name: "sa-create", method: "PATCH", path: sas + "/asa", query: "fieldManager=m1", ct: applyYAML, code: 201,
				body: "apiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: asa\nsecrets:\n- name: a\n- name: b\nautomountServiceAccountToken: true\n"},
			{name: "sa-second-manager-list-item", method: "PATCH", path: sas + "/asa", query: "fieldManager=m2", ct: applyYAML, code: 200,
				body: "apiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: asa\nsecrets:\n- name: c\n"},
			{name: "sa-conflict-scalar", method: "PATCH", path: sas + "/asa", query: "fieldManager=m2", ct: applyYAML, code: 409,
				body: "apiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: asa\nautomountServiceAccountToken: false\n"},
			{name: "sa-drop-list-item", method: "PATCH", path: sas + "/asa", query: "fieldManager=m1", ct: applyYAML, code: 200,
				body: "apiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: asa\nsecrets:\n- name: a\nautomountServiceAccountToken: true\n"},
			{name: "strip-managed-fields", method: "PATCH", path: sas + "/asa", query: "fieldManager=stripper", ct: mergePatch, code: 200,
				body: `{"metadata":{"managedFields":[{}]}}`},
			{name: "empty-managed-fields-keeps", method: "PATCH", path: secrets + "/ap2", query: "fieldManager=other", ct: mergePatch, code: 200,
				body: `{"metadata":{"managedFields":[],"labels":{"x":"1"}}}`},
		}},
		{name: "dry-run", steps: []step{
			{name: "create", method: "POST", path: secrets, query: "dryRun=All", code: 201,
				body: `{"metadata":{"name":"dr1"},"data":{"k":"dg=="}}`},
			{name: "get-not-created", path: secrets + "/dr1", code: 404},
			{name: "create-generate-name", method: "POST", path: secrets, query: "dryRun=All", code: 201,
				body: `{"metadata":{"generateName":"drg-"}}`},
			{name: "bad-value", method: "POST", path: secrets, query: "dryRun=Bogus", code: 422,
				body: `{"metadata":{"name":"dr2"}}`},
			{name: "setup", method: "POST", path: secrets, code: 201,
				body: `{"metadata":{"name":"dr3","labels":{"v":"1"}}}`},
			{name: "update", method: "PUT", path: secrets + "/dr3", query: "dryRun=All", code: 200,
				body: `{"metadata":{"name":"dr3","labels":{"v":"2"}}}`},
			{name: "patch", method: "PATCH", path: secrets + "/dr3", query: "dryRun=All", ct: mergePatch, code: 200,
				body: `{"metadata":{"labels":{"v":"3"}}}`},
			{name: "apply", method: "PATCH", path: secrets + "/dr3", query: "dryRun=All&fieldManager=m", ct: applyYAML, code: 200,
				body: "apiVersion: v1\nkind: Secret\nmetadata:\n  name: dr3\n  labels:\n    w: \"1\"\n"},
			{name: "apply-create", method: "PATCH", path: secrets + "/dr4", query: "dryRun=All&fieldManager=m", ct: applyYAML, code: 201,
				body: "apiVersion: v1\nkind: Secret\nmetadata:\n  name: dr4\n"},
			{name: "delete", method: "DELETE", path: secrets + "/dr3", query: "dryRun=All", code: 200},
			{name: "get-unchanged", path: secrets + "/dr3", code: 200},
			{name: "invalid-still-rejected", method: "POST", path: secrets, query: "dryRun=All", code: 422,
				body: `{"metadata":{"name":"BAD"}}`},
			{name: "deletecollection", method: "DELETE", path: secrets, query: "dryRun=All&labelSelector=v%3D1", code: 200},
			{name: "list-after", path: secrets, query: "labelSelector=v%3D1", code: 200},
			{name: "token", method: "POST", path: sas + "/default/token", query: "dryRun=All", code: 404,
				body: `{"apiVersion":"{{authentication}}/v1","kind":"TokenRequest","spec":{"audiences":["diff"]}}`},
		}},
		{name: "finalizers", steps: []step{
			{name: "create", method: "POST", path: secrets, code: 201,
				body: `{"metadata":{"name":"fin","finalizers":["example.com/keep"]}}`,
				save: map[string]string{"rv1": "metadata.resourceVersion"}},
			{name: "delete-precondition-uid", method: "DELETE", path: secrets + "/fin", code: 409,
				body: `{"kind":"DeleteOptions","apiVersion":"v1","preconditions":{"uid":"00000000-0000-0000-0000-000000000000"}}`},
			{name: "delete-precondition-rv", method: "DELETE", path: secrets + "/fin", code: 409,
				body: `{"kind":"DeleteOptions","apiVersion":"v1","preconditions":{"resourceVersion":"1"}}`},
			{name: "delete-bad-propagation", method: "DELETE", path: secrets + "/fin", query: "propagationPolicy=Bogus", code: 422},
			{name: "delete", method: "DELETE", path: secrets + "/fin", code: 200},
			{name: "get-terminating", path: secrets + "/fin", code: 200},
			{name: "add-finalizer-refused", method: "PATCH", path: secrets + "/fin", ct: mergePatch, code: 422,
				body: `{"metadata":{"finalizers":["example.com/keep","example.com/more"]}}`},
			{name: "update-while-terminating", method: "PATCH", path: secrets + "/fin", ct: mergePatch, code: 200,
				body: `{"metadata":{"labels":{"x":"1"}}}`},
			{name: "delete-again", method: "DELETE", path: secrets + "/fin", code: 200},
			{name: "remove-finalizer", method: "PATCH", path: secrets + "/fin", ct: jsonPatch, code: 200,
				body: `[{"op":"remove","path":"/metadata/finalizers"}]`},
			{name: "get-gone", path: secrets + "/fin", code: 404},
			{name: "bad-finalizer-name", method: "POST", path: secrets, code: 422,
				body: `{"metadata":{"name":"badfin","finalizers":["not a name"]}}`},
			{name: "delete-options-body-dry-run", method: "POST", path: secrets, code: 201,
				body: `{"metadata":{"name":"fin2"}}`},
			{name: "delete-body-dry-run", method: "DELETE", path: secrets + "/fin2", code: 200,
				body: `{"kind":"DeleteOptions","apiVersion":"v1","dryRun":["All"]}`},
			{name: "delete-body-not-options", method: "DELETE", path: secrets + "/fin2", code: 400,
				body: `{"kind":"Secret","apiVersion":"v1"}`},
			{name: "delete-negative-grace", method: "DELETE", path: secrets + "/fin2", query: "gracePeriodSeconds=-1", code: 200},
		}},
		{name: "deletecollection", steps: []step{
			{name: "create-1", method: "POST", path: secrets, code: 201, body: `{"metadata":{"name":"dc1","labels":{"dc":"1"}}}`},
			{name: "create-2", method: "POST", path: secrets, code: 201, body: `{"metadata":{"name":"dc2","labels":{"dc":"1"}}}`},
			{name: "create-3", method: "POST", path: secrets, code: 201, body: `{"metadata":{"name":"dc3","labels":{"dc":"2"}}}`},
			{name: "create-held", method: "POST", path: secrets, code: 201, body: `{"metadata":{"name":"dc4","labels":{"dc":"1"},"finalizers":["example.com/keep"]}}`},
			{name: "delete-by-label", method: "DELETE", path: secrets, query: "labelSelector=dc%3D1", code: 200},
			{name: "list-after", path: secrets, code: 200},
			{name: "bad-selector", method: "DELETE", path: secrets, query: "labelSelector=dc%3D%3D%3D", code: 400},
			{name: "by-field", method: "DELETE", path: secrets, query: "fieldSelector=metadata.name%3Ddc3", code: 200},
			{name: "sa-create", method: "POST", path: sas, code: 201, body: `{"metadata":{"name":"dcsa","labels":{"dc":"1"}}}`},
			{name: "sa-delete-by-label", method: "DELETE", path: sas, query: "labelSelector=dc%3D1", code: 200},
			{name: "release-held", method: "PATCH", path: secrets + "/dc4", ct: mergePatch, code: 200,
				body: `{"metadata":{"finalizers":null}}`},
			{name: "list-end", path: secrets, code: 200},
		}},
	}
}

// fieldValidationScenario: unknown and duplicate fields under each fieldValidation value, on
// create, update, each patch type and apply. Each value has its own object (fv-<value>), so a
// difference in one group does not carry into the next; apply comes last in each group.
func fieldValidationScenario() scenario {
	sc := scenario{name: "field-validation"}
	for _, fv := range []string{"", "Ignore", "Warn", "Strict"} {
		q := ""
		tag := "default"
		if fv != "" {
			q = "fieldValidation=" + fv
			tag = strings.ToLower(fv)
		}
		strict := fv == "Strict"
		code := func(ok int) int {
			if strict {
				return 400
			}
			return ok
		}
		code422 := func(ok int) int {
			if strict {
				return 422
			}
			return ok
		}
		name := func(s string) string { return fmt.Sprintf("%s-%s", tag, s) }
		obj := secrets + "/fv-" + tag
		sc.steps = append(sc.steps,
			step{name: name("setup"), method: "POST", path: secrets, code: 201,
				body: `{"metadata":{"name":"fv-` + tag + `"}}`},
			step{name: name("create-unknown"), method: "POST", path: secrets, query: q, code: code(201),
				body: `{"metadata":{"name":"fv-` + tag + `-1","bogus":1},"bogus":{"x":1},"type":"Opaque"}`},
			step{name: name("create-duplicate"), method: "POST", path: secrets, query: q, code: code(201),
				body: `{"metadata":{"name":"fv-` + tag + `-2"},"type":"Opaque","type":"Opaque"}`},
			step{name: name("update-unknown-and-duplicate"), method: "PUT", path: obj, query: q, code: code(200),
				body: `{"metadata":{"name":"fv-` + tag + `","labels":{"a":"1"}},"type":"Opaque","type":"Opaque","bogus":1}`},
			// Kubernetes checks a patch's result strictly after patching: 422, not 400.
			step{name: name("merge-patch-unknown"), method: "PATCH", path: obj, query: q, ct: mergePatch, code: code422(200),
				body: `{"bogus":1,"metadata":{"labels":{"m":"1"}}}`},
			step{name: name("merge-patch-duplicate"), method: "PATCH", path: obj, query: q, ct: mergePatch, code: code422(200),
				body: `{"metadata":{"labels":{"m":"2"}},"metadata":{"labels":{"m":"2"}}}`},
			step{name: name("strategic-unknown"), method: "PATCH", path: obj, query: q, ct: smPatch, code: code422(200),
				body: `{"bogus":1,"metadata":{"labels":{"s":"1"}}}`},
			step{name: name("json-patch-unknown"), method: "PATCH", path: obj, query: q, ct: jsonPatch, code: code422(200),
				body: `[{"op":"add","path":"/bogus","value":1}]`},
			step{name: name("apply-duplicate"), method: "PATCH", path: obj, query: joinQuery(q, "fieldManager=fv"), ct: applyYAML, code: code(200),
				body: "apiVersion: v1\nkind: Secret\nmetadata:\n  name: fv-" + tag + "\ntype: Opaque\ntype: Opaque\n"},
			// Kubernetes answers 500 to an applied unknown field whatever fieldValidation says.
			step{name: name("apply-unknown"), method: "PATCH", path: obj, query: joinQuery(q, "fieldManager=fv"), ct: applyYAML, code: 500,
				body: "apiVersion: v1\nkind: Secret\nmetadata:\n  name: fv-" + tag + "\nbogus: 1\n"},
		)
	}
	sc.steps = append(sc.steps,
		step{name: "bad-value", method: "POST", path: secrets, query: "fieldValidation=Bogus", code: 422,
			body: `{"metadata":{"name":"fv-bogus"}}`},
		// A map given twice: Go's decoder merges the two, keeping keys of both.
		step{name: "duplicate-map-merged", method: "POST", path: secrets, code: 201,
			body: `{"metadata":{"name":"fv-maps","labels":{"a":"1"},"labels":{"b":"2"}}}`},
	)
	return sc
}

func joinQuery(a, b string) string {
	if a == "" {
		return b
	}
	return a + "&" + b
}
