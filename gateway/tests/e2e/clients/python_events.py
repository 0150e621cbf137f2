"""Events (events.svc.io/v1) through the official Kubernetes Python client (PyPI `kubernetes`).

Usage: python_events.py KUBECONFIG NAMESPACE
The client has no typed API for our group, so events go through its generic API for any
group (CustomObjectsApi): create, list in one namespace and across all, a field selector,
and a refused create. Prints one line per check; exits non-zero on any failure.
"""
import sys

from kubernetes import client, config

GROUP, VERSION, PLURAL = "events.svc.io", "v1", "events"


def event(ns, name, reason, ty):
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Event",
        "metadata": {"name": name, "namespace": ns},
        "eventTime": "2024-05-06T07:08:09.123456Z",
        "reportingController": "svc.io/python",
        "reportingInstance": "python-1",
        "action": "Testing",
        "reason": reason,
        "regarding": {"kind": "Pod", "namespace": ns, "name": "web"},
        "note": f"{reason} from python",
        "type": ty,
    }


def main():
    kubeconfig, ns = sys.argv[1], sys.argv[2]
    config.load_kube_config(config_file=kubeconfig)
    core = client.CoreV1Api()
    events = client.CustomObjectsApi()

    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
    created = events.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, event(ns, "py.1", "Started", "Normal"))
    assert created["eventTime"] == "2024-05-06T07:08:09.123456Z", created
    assert created["metadata"]["resourceVersion"], created
    events.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, event(ns, "py.2", "Failed", "Warning"))
    print("create ok", created["metadata"]["uid"])

    listed = events.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL)
    assert listed["kind"] == "EventList", listed["kind"]
    names = [e["metadata"]["name"] for e in listed["items"]]
    assert names == ["py.1", "py.2"], names
    print("list ok", names, "resourceVersion", listed["metadata"]["resourceVersion"])

    everywhere = events.list_cluster_custom_object(GROUP, VERSION, PLURAL)
    pairs = {(e["metadata"]["namespace"], e["metadata"]["name"]) for e in everywhere["items"]}
    assert {(ns, "py.1"), (ns, "py.2")} <= pairs, pairs
    print("list all ok", len(everywhere["items"]))

    warnings = events.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, field_selector="type=Warning")
    assert [e["metadata"]["name"] for e in warnings["items"]] == ["py.2"], warnings["items"]
    print("selector ok")

    bad = event(ns, "py.3", "", "Info")
    try:
        events.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, bad)
        raise AssertionError("an invalid event was accepted")
    except client.exceptions.ApiException as e:
        assert e.status == 422, e.status
        assert '"field":"reason"' in e.body.replace(" ", ""), e.body
    print("invalid ok")


if __name__ == "__main__":
    main()
