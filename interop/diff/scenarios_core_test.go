package diff

import "time"

// The scenarios, in order. Each runs in its own namespace ({{ns}}), created first; names of
// cluster-scoped objects carry {{ns}} or {{run}} so that every run is independent.
func scenarios() []scenario {
	var all []scenario
	all = append(all, coreScenarios()...)
	all = append(all, writeScenarios()...)
	all = append(all, readScenarios()...)
	all = append(all, groupScenarios()...)
	return all
}

const (
	secrets = "/api/v1/namespaces/{{ns}}/secrets"
	sas     = "/api/v1/namespaces/{{ns}}/serviceaccounts"
	tableJS = "application/json;as=Table;v=v1;g={{meta}}"
)

func coreScenarios() []scenario {
	return []scenario{
		{name: "secrets-crud", steps: []step{
			{name: "create", method: "POST", path: secrets, code: 201,
				body: `{"apiVersion":"v1","kind":"Secret","metadata":{"name":"s1","labels":{"app":"diff"},"annotations":{"note":"x"}},"data":{"k":"dg=="},"stringData":{"s":"plain"},"type":"Opaque"}`,
				save: map[string]string{"rv1": "metadata.resourceVersion"}},
			{name: "create-again", method: "POST", path: secrets, code: 409,
				body: `{"metadata":{"name":"s1"}}`},
			{name: "get", path: secrets + "/s1", code: 200},
			{name: "get-missing", path: secrets + "/missing", code: 404},
			{name: "update", method: "PUT", path: secrets + "/s1", code: 200,
				body: `{"metadata":{"name":"s1","resourceVersion":"{{rv1}}","labels":{"app":"diff","v":"2"}},"data":{"k":"djI="},"type":"Opaque"}`},
			{name: "update-stale", method: "PUT", path: secrets + "/s1", code: 409,
				body: `{"metadata":{"name":"s1","resourceVersion":"{{rv1}}"},"data":{"k":"dg=="},"type":"Opaque"}`},
			{name: "update-unconditional", method: "PUT", path: secrets + "/s1", code: 200,
				body: `{"metadata":{"name":"s1","labels":{"app":"diff"}},"data":{"k":"djM="},"type":"Opaque"}`},
			{name: "update-name-mismatch", method: "PUT", path: secrets + "/s1", code: 400,
				body: `{"metadata":{"name":"s2"},"type":"Opaque"}`},
			{name: "update-missing", method: "PUT", path: secrets + "/missing", code: 404,
				body: `{"metadata":{"name":"missing"},"type":"Opaque"}`},
			{name: "update-type-immutable", method: "PUT", path: secrets + "/s1", code: 422,
				body: `{"metadata":{"name":"s1"},"type":"kubernetes.io/basic-auth"}`},
			{name: "create-namespace-mismatch", method: "POST", path: secrets, code: 400,
				body: `{"metadata":{"name":"s3","namespace":"other"}}`},
			{name: "create-kind-mismatch", method: "POST", path: secrets, code: 400,
				body: `{"apiVersion":"v1","kind":"ServiceAccount","metadata":{"name":"s4"}}`},
			{name: "create-generate-name", method: "POST", path: secrets, code: 201,
				body: `{"metadata":{"generateName":"gen-","labels":{"app":"diff"}}}`},
			{name: "create-immutable", method: "POST", path: secrets, code: 201,
				body: `{"metadata":{"name":"frozen"},"immutable":true,"data":{"k":"dg=="}}`},
			{name: "update-immutable-data", method: "PUT", path: secrets + "/frozen", code: 422,
				body: `{"metadata":{"name":"frozen"},"immutable":true,"data":{"k":"dzI="}}`},
			{name: "list-by-label", path: secrets, query: "labelSelector=app%3Ddiff", code: 200},
			{name: "delete", method: "DELETE", path: secrets + "/s1", code: 200},
			{name: "delete-missing", method: "DELETE", path: secrets + "/s1", code: 404},
			{name: "get-deleted", path: secrets + "/s1", code: 404},
		}},
		{name: "secrets-invalid", steps: []step{
			{name: "name-uppercase", method: "POST", path: secrets, code: 422,
				body: `{"metadata":{"name":"Bad_Name"}}`},
			{name: "name-too-long", method: "POST", path: secrets, code: 422,
				body: `{"metadata":{"name":"a234567890123456789012345678901234567890123456789012345678901234567890123456789012345678901234567890123456789012345678901234567890123456789012345678901234567890123456789012345678901234567890123456789012345678901234567890123456789012345678901234567890123456789012345"}}`},
			{name: "no-name", method: "POST", path: secrets, code: 422, body: `{"metadata":{}}`},
			{name: "bad-data-key", method: "POST", path: secrets, code: 422,
				body: `{"metadata":{"name":"badkey"},"data":{"bad key!":"dg=="}}`},
			{name: "data-not-base64", method: "POST", path: secrets, code: 400,
				body: `{"metadata":{"name":"nob64"},"data":{"k":"not base64!"}}`},
			{name: "bad-label", method: "POST", path: secrets, code: 422,
				body: `{"metadata":{"name":"badlabel","labels":{"bad key!":"v"}}}`},
			{name: "bad-label-value", method: "POST", path: secrets, code: 422,
				body: `{"metadata":{"name":"badlabel","labels":{"k":"bad value!"}}}`},
			{name: "body-not-json", method: "POST", path: secrets, code: 400, body: `{"metadata":`},
			{name: "body-wrong-type", method: "POST", path: secrets, code: 400, body: `{"metadata":{"name":5}}`},
			{name: "body-array", method: "POST", path: secrets, code: 400, body: `[1,2]`},
			{name: "basic-auth-missing-keys", method: "POST", path: secrets, code: 422,
				body: `{"metadata":{"name":"ba"},"type":"kubernetes.io/basic-auth","data":{"other":"dg=="}}`},
			{name: "unsupported-media-type", method: "POST", path: secrets, code: 415, ct: "text/plain",
				body: `{"metadata":{"name":"plain"}}`},
			{name: "not-acceptable", path: secrets, code: 406, accept: "text/html"},
		}},
		{name: "serviceaccounts", steps: []step{
			{name: "create", method: "POST", path: sas, code: 201,
				body: `{"metadata":{"name":"sa1","labels":{"app":"diff"}},"automountServiceAccountToken":false,"secrets":[{"name":"a"}],"imagePullSecrets":[{"name":"pull"}]}`,
				save: map[string]string{"rv1": "metadata.resourceVersion"}},
			{name: "get", path: sas + "/sa1", code: 200},
			{name: "list-by-label", path: sas, query: "labelSelector=app%3Ddiff", code: 200},
			{name: "update-stale", method: "PUT", path: sas + "/sa1", code: 200,
				body: `{"metadata":{"name":"sa1","resourceVersion":"{{rv1}}","labels":{"app":"diff"}},"secrets":[{"name":"b"}]}`},
			{name: "update-stale-again", method: "PUT", path: sas + "/sa1", code: 409,
				body: `{"metadata":{"name":"sa1","resourceVersion":"{{rv1}}"}}`},
			{name: "create-invalid-name", method: "POST", path: sas, code: 422,
				body: `{"metadata":{"name":"sa.1!"}}`},
			{name: "token-secret", method: "POST", path: secrets, code: 201,
				body: `{"metadata":{"name":"bound"}}`},
			{name: "token", method: "POST", path: sas + "/sa1/token", code: 201,
				body: `{"apiVersion":"{{authentication}}/v1","kind":"TokenRequest","spec":{"audiences":["diff"],"expirationSeconds":3600}}`},
			{name: "token-bound-secret", method: "POST", path: sas + "/sa1/token", code: 201,
				body: `{"apiVersion":"{{authentication}}/v1","kind":"TokenRequest","spec":{"audiences":["diff"],"expirationSeconds":3600,"boundObjectRef":{"apiVersion":"v1","kind":"Secret","name":"bound"}}}`},
			{name: "token-bound-missing", method: "POST", path: sas + "/sa1/token", code: 404,
				body: `{"apiVersion":"{{authentication}}/v1","kind":"TokenRequest","spec":{"audiences":["diff"],"boundObjectRef":{"apiVersion":"v1","kind":"Secret","name":"nope"}}}`},
			{name: "token-bound-bad-kind", method: "POST", path: sas + "/sa1/token", code: 400,
				body: `{"apiVersion":"{{authentication}}/v1","kind":"TokenRequest","spec":{"audiences":["diff"],"boundObjectRef":{"apiVersion":"v1","kind":"ConfigMap","name":"x"}}}`},
			{name: "token-short-expiry", method: "POST", path: sas + "/sa1/token", code: 422,
				body: `{"apiVersion":"{{authentication}}/v1","kind":"TokenRequest","spec":{"audiences":["diff"],"expirationSeconds":60}}`},
			{name: "token-missing-sa", method: "POST", path: sas + "/nobody/token", code: 404,
				body: `{"apiVersion":"{{authentication}}/v1","kind":"TokenRequest","spec":{"audiences":["diff"]}}`},
			{name: "token-get", path: sas + "/sa1/token", code: 405},
			{name: "delete", method: "DELETE", path: sas + "/sa1", code: 200},
			{name: "get-deleted", path: sas + "/sa1", code: 404},
		}},
		{name: "namespaces", steps: []step{
			{name: "get", path: "/api/v1/namespaces/{{ns}}", code: 200},
			{name: "create-invalid-name", method: "POST", path: "/api/v1/namespaces", code: 422,
				body: `{"metadata":{"name":"Bad.Name"}}`},
			{name: "create-again", method: "POST", path: "/api/v1/namespaces", code: 409,
				body: `{"metadata":{"name":"{{ns}}"}}`},
			{name: "create-held", method: "POST", path: "/api/v1/namespaces", code: 201,
				body: `{"metadata":{"name":"{{ns}}-held","labels":{"diff-ns":"{{ns}}"},"finalizers":["example.com/hold"]}}`},
			{name: "list-by-label", path: "/api/v1/namespaces", query: "labelSelector=diff-ns%3D{{ns}}", code: 200},
			{name: "table", path: "/api/v1/namespaces/{{ns}}", accept: tableJS, code: 200},
			{name: "secret-in-held", method: "POST", path: "/api/v1/namespaces/{{ns}}-held/secrets", code: 201,
				body: `{"metadata":{"name":"inside"}}`},
			{name: "delete-held", method: "DELETE", path: "/api/v1/namespaces/{{ns}}-held", code: 200},
			{name: "get-terminating", path: "/api/v1/namespaces/{{ns}}-held", code: 200},
			{name: "create-in-terminating", method: "POST", path: "/api/v1/namespaces/{{ns}}-held/secrets", code: 403,
				body: `{"metadata":{"name":"late"}}`},
			{name: "release", method: "PATCH", path: "/api/v1/namespaces/{{ns}}-held", code: 200,
				ct: "application/merge-patch+json", body: `{"metadata":{"finalizers":null}}`},
			{name: "get-released", path: "/api/v1/namespaces/{{ns}}-held", sleep: 2 * time.Second, code: 200},
			{name: "secret-in-missing-namespace", method: "POST", path: "/api/v1/namespaces/{{ns}}-nowhere/secrets", code: 404,
				body: `{"metadata":{"name":"x"}}`},
		}},
	}
}
