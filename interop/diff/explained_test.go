package diff

// explained maps differences to the entries of ../DIFFERENCES.md; see explanation. The first
// row that matches wins, so narrow rows come before broad ones.
var explained = []explanation{
	// D3: error texts written by Go libraries (encoding/json, strconv, the selector parsers).
	{"D3", "secrets-crud/create-kind-mismatch secrets-invalid/body-* patch-types/json-patch-not-array " +
		"patch-types/merge-patch-not-object apply/bad-yaml apply/wrong-kind apply/no-kind " +
		"field-validation/strict-create-* field-validation/strict-update-* field-validation/strict-apply-duplicate " +
		"chunking/continue-garbage deletecollection/bad-selector hostile-queries/label-selector-* " +
		"hostile-queries/field-selector-* events/field-selector-unsupported hostile-queries/limit-* " +
		"hostile-queries/timeout-not-a-number resource-versions/list-garbage-rv* resource-versions/list-negative-rv " +
		"finalizers/delete-body-not-options",
		"body.message"},

	// D4: invalid list option combinations are 400 BadRequest, as the spec's Errors table says.
	{"D4", "chunking/continue-with-exact resource-versions/list-exact-no-rv resource-versions/list-exact-rv-0 " +
		"resource-versions/list-not-older-than-no-rv resource-versions/list-unknown-match " +
		"watch/streaming-list-no-match watch/send-initial-events-on-list watch/watch-exact",
		"code body.code body.reason body.message body.details"},

	// D6: deletecollection answers a Status, as the spec's operation tables say.
	{"D6", "deletecollection/delete-by-label deletecollection/by-field deletecollection/sa-delete-by-label " +
		"dry-run/deletecollection events/deletecollection",
		"body.apiVersion body.items body.kind body.metadata body.metadata.resourceVersion body.status"},

	// D8: kube-apiserver runs without kube-controller-manager.
	{"D8", "namespaces/get-released dry-run/token", "*"},

	// D9: ObjectReference items are atomic in Kubernetes' managedFields.
	{"D9", "*", "*managedFields*f:secrets.k:* *managedFields*f:regarding*"},

	// D10: what managedFields records around defaulting and the server's own fields.
	{"D10", "namespaces/* certificates/*", "*managedFields*.fieldsV1.f:spec"},
	{"D10", "certificates/approve certificates/deny certificates/get-denied", "body.metadata.managedFields[*]"},
	{"D10", "secrets-crud/create-generate-name secrets-crud/list-by-label dry-run/create-generate-name",
		"*managedFields*f:generateName *managedFields[*].fieldsV1.f:metadata"},
	{"D10", "events/*", "*managedFields*f:deprecated*"},
	{"D10", "webhook-configurations/apply-mutating", "*managedFields*f:webhooks[\".\"]"},
	{"D10", "apply/empty-managed-fields-keeps", "body.metadata.managedFields"},

	// D11: the credential id in a user's extra.
	{"D11", "token-review/review", "body.status.user.extra*"},

	// D12: Table columns.
	{"D12", "tables/* namespaces/table certificates/table events/table webhook-configurations/table-validating",
		"body.columnDefinitions* body.rows[*].cells[*] body.rows[*].object"},

	// D13: the gateway's watch history is 2 s in run.sh.
	{"D13", "watch/expired-rv", "events*"},

	// D14: Kubernetes quirks the gateway does not copy.
	{"D14", "resource-versions/get-garbage-rv field-validation/*-apply-unknown hostile-queries/watch-not-a-bool " +
		"field-validation/duplicate-map-merged", "*"},

	// D15: duplicate YAML keys in an applied configuration are refused.
	{"D15", "field-validation/*-apply-duplicate", "*"},

	// D17: resourceVersion=0 with limit or continue.
	{"D17", "resource-versions/list-rv-0-limit chunking/continue-with-rv-0",
		"body.items[*] body.metadata.continue body.metadata.remainingItemCount"},

	// D18: 404, 405, 406 and 415 Status texts and details.
	{"D18", "hostile-queries/unknown-resource hostile-queries/unknown-version hostile-queries/subresource-unknown " +
		"hostile-queries/method-not-allowed hostile-queries/post-to-name serviceaccounts/token-get " +
		"token-review/review-get secrets-invalid/not-acceptable secrets-invalid/unsupported-media-type " +
		"patch-types/unsupported-patch-type tables/wrong-group tables/wrong-version",
		"body.details body.details.kind body.details.name body.message"},
	{"D18", "hostile-queries/unknown-group", "*"},

	// D19: Table watches.
	{"D19", "tables/watch", "*"},

	// D20: validation causes: field paths and texts.
	{"D20", "secrets-invalid/bad-data-key secrets-invalid/bad-label secrets-invalid/bad-label-value " +
		"finalizers/bad-finalizer-name patch-types/merge-patch-invalid-result apply/invalid-result " +
		"certificates/create-* certificates/deny-after-approve certificates/remove-approval " +
		"certificates/status-bad-certificate webhook-configurations/create-* serviceaccounts/token-short-expiry",
		"body.message body.details.causes*"},

	// D21: Kubernetes validates events.k8s.io Events as core Events.
	{"D21", "events/create-* events/note-immutable", "body.message body.details.causes* body.details.group"},

	// D23: data that is not base64.
	{"D23", "secrets-invalid/data-not-base64", "*"},

	// D24: the TokenRequest answer.
	{"D24", "serviceaccounts/token serviceaccounts/token-bound-secret token-review/token",
		"body.metadata.managedFields body.metadata.uid body.spec.boundObjectRef*"},
	{"D24", "serviceaccounts/token-bound-bad-kind", "*"},

	// D25: the TokenReview answer.
	{"D25", "token-review/review*", "body.metadata.creationTimestamp body.metadata.managedFields body.status.error body.status.user"},

	// D26: JSON Patch failures.
	{"D26", "patch-types/json-patch-*", "*"},
	{"D26", "field-validation/strict-*-patch-* field-validation/strict-strategic-*",
		"code body.code body.reason body.message body.details"},

	// D27: DeleteOptions checks.
	{"D27", "finalizers/delete-precondition-* finalizers/delete-bad-propagation finalizers/delete-negative-grace", "*"},

	// D28: the resourceVersion of a deleted object.
	{"D28", "serviceaccounts/delete finalizers/remove-finalizer deletecollection/release-held " +
		"finalizers/delete-options-body-dry-run", "body.metadata.resourceVersion"},

	// D29: a CertificateSigningRequest's spec on update.
	{"D29", "certificates/update-spec-ignored", "*"},
	{"D29", "certificates/create-deny certificates/deny certificates/get-denied", "body.metadata.resourceVersion"},

	// D30: a write that changes nothing.
	{"D30", "patch-types/sa-*", "body.metadata.resourceVersion"},
}

// timingDependent rows explain differences that depend on timing or on map order inside
// Kubernetes, so a run may not see them; they are not checked for occurring.
var timingDependent = []explanation{
	// D8: the gateway's namespace controller may already have emptied the contents and dropped
	// spec.finalizers of the held namespace when these steps run.
	{"D8", "namespaces/get-terminating namespaces/release", "body.spec body.spec.finalizers body.metadata.resourceVersion"},
	// D35: Kubernetes may set continue when only non-matching keys remain (depends on which
	// other namespaces exist on the server).
	{"D35", "chunking/all-namespaces-page", "body.metadata.continue"},
	// D34: the order of merged keyed-list items in a strategic merge patch.
	{"D34", "patch-types/sa-strategic-*", "body.secrets[*].name"},
}
