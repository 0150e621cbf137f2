package diff

import "strings"

const (
	events = "/apis/{{events}}/v1/namespaces/{{ns}}/events"
	csrs   = "/apis/{{certificates}}/v1/certificatesigningrequests"
	vwcs   = "/apis/{{admissionregistration}}/v1/validatingwebhookconfigurations"
	mwcs   = "/apis/{{admissionregistration}}/v1/mutatingwebhookconfigurations"
)

func eventBody(name, extra string) string {
	return `{"apiVersion":"{{events}}/v1","kind":"Event","metadata":{"name":"` + name + `","labels":{"diff":"ev"}},` +
		`"eventTime":"2024-01-01T00:00:00.000000Z","action":"Testing","reason":"Tested","note":"hello",` +
		`"type":"Normal","reportingController":"example.com/diff","reportingInstance":"diff-1",` +
		`"regarding":{"apiVersion":"v1","kind":"Secret","namespace":"{{ns}}","name":"x"}` + extra + `}`
}

func csrBody(name, spec string) string {
	return `{"apiVersion":"{{certificates}}/v1","kind":"CertificateSigningRequest","metadata":{"name":"` + name + `","labels":{"diff-run":"{{run}}"}},` +
		`"spec":{"request":"{{csr}}","signerName":"example.com/diff","usages":["digital signature","client auth"]` + spec + `}}`
}

const webhook = `{"name":"check.example.com","clientConfig":{"url":"https://example.invalid/check"},` +
	`"rules":[{"apiGroups":["example.com"],"apiVersions":["v1"],"operations":["CREATE"],"resources":["widgets"]}],` +
	`"sideEffects":"None","admissionReviewVersions":["v1"]}`

func webhookConfig(kind, name, webhooks string) string {
	return `{"apiVersion":"{{admissionregistration}}/v1","kind":"` + kind + `","metadata":{"name":"` + name + `","labels":{"diff-run":"{{run}}"}},"webhooks":[` + webhooks + `]}`
}

func groupScenarios() []scenario {
	return []scenario{
		{name: "events", steps: []step{
			{name: "create", method: "POST", path: events, code: 201, body: eventBody("e1", ""),
				save: map[string]string{"rv1": "metadata.resourceVersion"}},
			{name: "get", path: events + "/e1", code: 200},
			{name: "list", path: events, code: 200},
			{name: "list-all-namespaces", path: "/apis/{{events}}/v1/events", query: "labelSelector=diff%3Dev&fieldSelector=metadata.namespace%3D{{ns}}", code: 200},
			{name: "table", path: events, accept: tableJS, code: 200},
			{name: "field-selector-reason", path: events, query: "fieldSelector=reason%3DTested", code: 200},
			{name: "field-selector-regarding", path: events, query: "fieldSelector=regarding.name%3Dx", code: 200},
			{name: "field-selector-type", path: events, query: "fieldSelector=type%3DWarning", code: 200},
			{name: "field-selector-unsupported", path: events, query: "fieldSelector=note%3Dhello", code: 400},
			{name: "update", method: "PUT", path: events + "/e1", code: 200,
				body: replace(eventBody("e1", `,"series":{"count":2,"lastObservedTime":"2024-01-01T00:01:00.000000Z"}`), `"name":"e1"`, `"name":"e1","resourceVersion":"{{rv1}}"`)},
			{name: "update-stale", method: "PUT", path: events + "/e1", code: 409,
				body: replace(eventBody("e1", ""), `"name":"e1"`, `"name":"e1","resourceVersion":"{{rv1}}"`)},
			{name: "strategic-merge-patch", method: "PATCH", path: events + "/e1", ct: smPatch, code: 200,
				body: `{"metadata":{"labels":{"p":"1"}},"series":{"count":3}}`},
			{name: "note-immutable", method: "PATCH", path: events + "/e1", ct: mergePatch, code: 422,
				body: `{"note":"patched"}`},
			{name: "apply", method: "PATCH", path: events + "/e2", query: "fieldManager=m1", ct: applyYAML, code: 201,
				body: eventBody("e2", "")},
			{name: "create-missing-required", method: "POST", path: events, code: 422,
				body: `{"apiVersion":"{{events}}/v1","kind":"Event","metadata":{"name":"bad"},"eventTime":"2024-01-01T00:00:00.000000Z"}`},
			{name: "create-no-event-time", method: "POST", path: events, code: 422,
				body: `{"apiVersion":"{{events}}/v1","kind":"Event","metadata":{"name":"bad2"},"action":"a","reason":"r","type":"Normal","reportingController":"example.com/c","reportingInstance":"i"}`},
			{name: "create-bad-type", method: "POST", path: events, code: 422,
				body: `{"apiVersion":"{{events}}/v1","kind":"Event","metadata":{"name":"bad3"},"eventTime":"2024-01-01T00:00:00.000000Z","action":"a","reason":"r","type":"Odd","reportingController":"example.com/c","reportingInstance":"i"}`},
			{name: "create-long-reason", method: "POST", path: events, code: 422,
				body: `{"apiVersion":"{{events}}/v1","kind":"Event","metadata":{"name":"bad4"},"eventTime":"2024-01-01T00:00:00.000000Z","action":"a","reason":"` + long(129) + `","type":"Normal","reportingController":"example.com/c","reportingInstance":"i"}`},
			{name: "create-long-note", method: "POST", path: events, code: 422,
				body: `{"apiVersion":"{{events}}/v1","kind":"Event","metadata":{"name":"bad5"},"eventTime":"2024-01-01T00:00:00.000000Z","action":"a","reason":"r","note":"` + long(1025) + `","type":"Normal","reportingController":"example.com/c","reportingInstance":"i"}`},
			{name: "delete", method: "DELETE", path: events + "/e1", code: 200},
			{name: "delete-missing", method: "DELETE", path: events + "/e1", code: 404},
			{name: "deletecollection", method: "DELETE", path: events, code: 200},
			{name: "list-after", path: events, code: 200},
		}},
		{name: "certificates", steps: []step{
			{name: "create", method: "POST", path: csrs, code: 201, body: csrBody("{{ns}}-c1", `,"expirationSeconds":3600`),
				save: map[string]string{"rv1": "metadata.resourceVersion"}},
			{name: "get", path: csrs + "/{{ns}}-c1", code: 200},
			{name: "list-by-label", path: csrs, query: "labelSelector=diff-run%3D{{run}}&fieldSelector=metadata.name%3D{{ns}}-c1", code: 200},
			{name: "field-selector-signer", path: csrs, query: "labelSelector=diff-run%3D{{run}}&fieldSelector=spec.signerName%3Dexample.com%2Fdiff", code: 200},
			{name: "table", path: csrs + "/{{ns}}-c1", accept: tableJS, code: 200},
			{name: "get-approval", path: csrs + "/{{ns}}-c1/approval", code: 200},
			{name: "get-status", path: csrs + "/{{ns}}-c1/status", code: 200},
			{name: "approve", method: "PUT", path: csrs + "/{{ns}}-c1/approval", code: 200,
				body: replace(csrBody("{{ns}}-c1", ""), `"spec"`, `"status":{"conditions":[{"type":"Approved","status":"True","reason":"Diff","message":"ok"}]},"spec"`)},
			{name: "deny-after-approve", method: "PUT", path: csrs + "/{{ns}}-c1/approval", code: 422,
				body: replace(csrBody("{{ns}}-c1", ""), `"spec"`, `"status":{"conditions":[{"type":"Approved","status":"True","reason":"Diff"},{"type":"Denied","status":"True","reason":"Diff"}]},"spec"`)},
			{name: "remove-approval", method: "PUT", path: csrs + "/{{ns}}-c1/approval", code: 422,
				body: csrBody("{{ns}}-c1", "")},
			{name: "update-spec-ignored", method: "PUT", path: csrs + "/{{ns}}-c1", code: 200,
				body: replace(csrBody("{{ns}}-c1", `,"expirationSeconds":7200`), `"labels"`, `"annotations":{"a":"1"},"labels"`)},
			{name: "status-bad-certificate", method: "PUT", path: csrs + "/{{ns}}-c1/status", code: 422,
				body: replace(csrBody("{{ns}}-c1", ""), `"spec"`, `"status":{"conditions":[{"type":"Approved","status":"True","reason":"Diff"}],"certificate":"bm90IGEgY2VydA=="},"spec"`)},
			{name: "create-short-expiry", method: "POST", path: csrs, code: 422, body: csrBody("{{ns}}-c2", `,"expirationSeconds":100`)},
			{name: "create-bad-signer", method: "POST", path: csrs, code: 422,
				body: replace(csrBody("{{ns}}-c3", ""), "example.com/diff", "bad")},
			{name: "create-bad-usage", method: "POST", path: csrs, code: 422,
				body: replace(csrBody("{{ns}}-c4", ""), `"client auth"`, `"flying"`)},
			{name: "create-not-pem", method: "POST", path: csrs, code: 422,
				body: replace(csrBody("{{ns}}-c5", ""), "{{csr}}", "bm90IGEgY3Ny")},
			{name: "create-no-request", method: "POST", path: csrs, code: 422,
				body: `{"apiVersion":"{{certificates}}/v1","kind":"CertificateSigningRequest","metadata":{"name":"{{ns}}-c6"},"spec":{"signerName":"example.com/diff"}}`},
			{name: "create-deny", method: "POST", path: csrs, code: 201, body: csrBody("{{ns}}-c7", "")},
			{name: "deny", method: "PUT", path: csrs + "/{{ns}}-c7/approval", code: 200,
				body: replace(csrBody("{{ns}}-c7", ""), `"spec"`, `"status":{"conditions":[{"type":"Denied","status":"True","reason":"No"}]},"spec"`)},
			{name: "get-denied", path: csrs + "/{{ns}}-c7", code: 200},
			{name: "delete", method: "DELETE", path: csrs + "/{{ns}}-c7", code: 200},
			{name: "delete-missing", method: "DELETE", path: csrs + "/{{ns}}-c7", code: 404},
		}},
		{name: "token-review", steps: []step{
			{name: "sa", method: "POST", path: sas, code: 201, body: `{"metadata":{"name":"reviewed"}}`},
			{name: "token", method: "POST", path: sas + "/reviewed/token", code: 201,
				body: `{"apiVersion":"{{authentication}}/v1","kind":"TokenRequest","spec":{"audiences":["diff"]}}`,
				save: map[string]string{"token": "status.token"}},
			{name: "review", method: "POST", path: "/apis/{{authentication}}/v1/tokenreviews", code: 201,
				body: `{"apiVersion":"{{authentication}}/v1","kind":"TokenReview","spec":{"token":"{{token}}","audiences":["diff"]}}`},
			{name: "review-wrong-audience", method: "POST", path: "/apis/{{authentication}}/v1/tokenreviews", code: 201,
				body: `{"apiVersion":"{{authentication}}/v1","kind":"TokenReview","spec":{"token":"{{token}}","audiences":["other"]}}`},
			{name: "review-garbage", method: "POST", path: "/apis/{{authentication}}/v1/tokenreviews", code: 201,
				body: `{"apiVersion":"{{authentication}}/v1","kind":"TokenReview","spec":{"token":"garbage"}}`},
			{name: "review-no-token", method: "POST", path: "/apis/{{authentication}}/v1/tokenreviews", code: 400,
				body: `{"apiVersion":"{{authentication}}/v1","kind":"TokenReview","spec":{}}`},
			{name: "review-get", path: "/apis/{{authentication}}/v1/tokenreviews", code: 405},
		}},
		{name: "webhook-configurations", steps: []step{
			{name: "create-validating", method: "POST", path: vwcs, code: 201,
				body: webhookConfig("ValidatingWebhookConfiguration", "{{ns}}-v", webhook)},
			{name: "get-validating", path: vwcs + "/{{ns}}-v", code: 200},
			{name: "list-validating", path: vwcs, query: "labelSelector=diff-run%3D{{run}}&fieldSelector=metadata.name%3D{{ns}}-v", code: 200},
			{name: "table-validating", path: vwcs + "/{{ns}}-v", accept: tableJS, code: 200},
			{name: "patch-validating", method: "PATCH", path: vwcs + "/{{ns}}-v", ct: jsonPatch, code: 200,
				body: `[{"op":"replace","path":"/webhooks/0/timeoutSeconds","value":5}]`},
			{name: "create-mutating", method: "POST", path: mwcs, code: 201,
				body: webhookConfig("MutatingWebhookConfiguration", "{{ns}}-m", webhook)},
			{name: "apply-mutating", method: "PATCH", path: mwcs + "/{{ns}}-m", query: "fieldManager=m1&force=true", ct: applyYAML, code: 200,
				body: webhookConfig("MutatingWebhookConfiguration", "{{ns}}-m", webhook[:len(webhook)-1]+`,"reinvocationPolicy":"IfNeeded"}`)},
			{name: "create-bad-name", method: "POST", path: vwcs, code: 422,
				body: webhookConfig("ValidatingWebhookConfiguration", "{{ns}}-bad1", replace(webhook, "check.example.com", "check"))},
			{name: "create-no-side-effects", method: "POST", path: vwcs, code: 422,
				body: webhookConfig("ValidatingWebhookConfiguration", "{{ns}}-bad2", replace(webhook, `"sideEffects":"None",`, ""))},
			{name: "create-duplicate-webhook", method: "POST", path: vwcs, code: 422,
				body: webhookConfig("ValidatingWebhookConfiguration", "{{ns}}-bad3", webhook+","+webhook)},
			{name: "create-bad-url", method: "POST", path: vwcs, code: 422,
				body: webhookConfig("ValidatingWebhookConfiguration", "{{ns}}-bad4", replace(webhook, "https://example.invalid/check", "http://example.invalid/check"))},
			{name: "delete-validating", method: "DELETE", path: vwcs + "/{{ns}}-v", code: 200},
			{name: "delete-mutating", method: "DELETE", path: mwcs + "/{{ns}}-m", code: 200},
		}},
	}
}

func long(n int) string {
	b := make([]byte, n)
	for i := range b {
		b[i] = 'x'
	}
	return string(b)
}

func replace(s, old, new string) string { return strings.Replace(s, old, new, 1) }
