"""Drives the server with the official Kubernetes Python client (PyPI `kubernetes`).

Usage: python_client.py KUBECONFIG NAMESPACE
Lists service accounts, opens a watch, creates one account from a second thread and checks
that the watch sees it; asks for a token and reviews it. Prints one line per check; exits non-zero on any failure.
"""
import sys
import threading
import time

from kubernetes import client, config, watch


def main():
    kubeconfig, ns = sys.argv[1], sys.argv[2]
    config.load_kube_config(config_file=kubeconfig)
    v1 = client.CoreV1Api()

    v1.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
    v1.create_namespaced_service_account(ns, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name="from-python")))
    listed = v1.list_service_account_for_all_namespaces()
    names = {(sa.metadata.namespace, sa.metadata.name) for sa in listed.items}
    assert (ns, "from-python") in names, names
    print("list ok", len(listed.items), "resourceVersion", listed.metadata.resource_version)

    def create_later():
        time.sleep(1.0)
        v1.create_namespaced_service_account(ns, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name="seen-by-watch")))

    threading.Thread(target=create_later, daemon=True).start()
    w = watch.Watch()
    seen = []
    for event in w.stream(v1.list_namespaced_service_account, ns, resource_version=listed.metadata.resource_version, timeout_seconds=15):
        seen.append((event["type"], event["object"].metadata.name))
        if event["object"].metadata.name == "seen-by-watch":
            w.stop()
    assert ("ADDED", "seen-by-watch") in seen, seen
    print("watch ok", seen)

    got = v1.read_namespaced_service_account("from-python", ns)
    got.automount_service_account_token = False
    replaced = v1.replace_namespaced_service_account("from-python", ns, got)
    assert replaced.automount_service_account_token is False
    print("replace ok", replaced.metadata.resource_version)
    v1.delete_namespaced_service_account("from-python", ns)
    try:
        v1.read_namespaced_service_account("from-python", ns)
        raise AssertionError("still there after delete")
    except client.exceptions.ApiException as e:
        assert e.status == 404, e.status
    print("delete ok")

    # A token through the Python client's own TokenRequest (authentication.k8s.io/v1 on the
    # wire), then reviewed with TokenReview through the generic API (our group's name).
    tr = v1.create_namespaced_service_account_token(
        "default", ns, client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=900)))
    assert tr.status.token.count(".") == 2, tr.status.token
    assert tr.spec.expiration_seconds == 900, tr.spec
    reviewed = client.CustomObjectsApi().create_cluster_custom_object(
        "authentication.svc.io", "v1", "tokenreviews",
        {"apiVersion": "authentication.svc.io/v1", "kind": "TokenReview", "spec": {"token": tr.status.token}})
    assert reviewed["status"]["authenticated"] is True, reviewed
    assert reviewed["status"]["user"]["username"] == "system:serviceaccount:%s:default" % ns, reviewed
    print("token ok", reviewed["status"]["user"]["username"])


if __name__ == "__main__":
    main()
