"""Drives the svc gateway's proxy mode with the official Kubernetes Python client (PyPI `kubernetes`).

Usage: python_client.py KUBECONFIG NAMESPACE

The kubeconfig names the proxy; the namespace exists (with its default ServiceAccount). Creates
two ConfigMaps and a Pod, lists the ConfigMaps with resourceVersion=0 (the proxy's cache) and
the Pod with field selectors, watches the ConfigMaps from the list's resourceVersion while a
second thread creates, updates and deletes one each, and runs the client's informer (or, in a
client without one, a watch from resourceVersion=0) to see a ConfigMap created after it
started. Prints one line per check; exits non-zero on any failure.
"""
import functools
import logging
import queue
import sys
import threading
import time

from kubernetes import client, config, watch

POD_IMAGE = "registry.k8s.io/pause:3.10"


def configmap(name, data):
    return client.V1ConfigMap(metadata=client.V1ObjectMeta(name=name, labels={"from": "python"}), data=data)


def until(what, seconds, f):
    """Calls f until it returns a true value (returned), for at most `seconds`: a read with
    resourceVersion=0 may come from a cache a little behind the writes before it."""
    deadline = time.monotonic() + seconds
    tries = 0
    while True:
        tries += 1
        got = f()
        if got:
            return got, tries
        if time.monotonic() > deadline:
            raise AssertionError("%s: not so after %d s (%d tries)" % (what, seconds, tries))
        time.sleep(0.2)


def main():
    kubeconfig, ns = sys.argv[1], sys.argv[2]
    config.load_kube_config(config_file=kubeconfig)
    v1 = client.CoreV1Api()

    one = v1.create_namespaced_config_map(ns, configmap("one", {"k": "1"}))
    two = v1.create_namespaced_config_map(ns, configmap("two", {"k": "2"}))
    pod = v1.create_namespaced_pod(ns, client.V1Pod(
        metadata=client.V1ObjectMeta(name="p"),
        spec=client.V1PodSpec(containers=[client.V1Container(name="c", image=POD_IMAGE)])))
    assert pod.spec.node_name is None, pod.spec.node_name
    print("create ok", one.metadata.resource_version, two.metadata.resource_version, pod.metadata.resource_version, flush=True)

    # A list with resourceVersion=0: the proxy serves it from its cache.
    def both_listed():
        listed = v1.list_namespaced_config_map(ns, resource_version="0")
        names = sorted(cm.metadata.name for cm in listed.items)
        return listed if names == ["one", "two"] else None

    listed, tries = until("the list resourceVersion=0 has one and two", 15, both_listed)
    start = listed.metadata.resource_version
    assert start and int(start) >= int(two.metadata.resource_version), (start, two.metadata.resource_version)
    print("list configmaps resourceVersion=0 ok", [cm.metadata.name for cm in listed.items], "resourceVersion", start, "tries", tries, flush=True)

    # Field selectors on pods: the unscheduled one by name, from the cache and passed through.
    selector = "spec.nodeName=,metadata.name=p"
    pods, tries = until("the pod list %s resourceVersion=0" % selector, 15, lambda: v1.list_namespaced_pod(
        ns, field_selector=selector, resource_version="0").items)
    assert [p.metadata.name for p in pods] == ["p"], [p.metadata.name for p in pods]
    direct = v1.list_namespaced_pod(ns, field_selector=selector).items
    assert [p.metadata.name for p in direct] == ["p"], [p.metadata.name for p in direct]
    none = v1.list_namespaced_pod(ns, field_selector="spec.nodeName=nowhere,metadata.name=p", resource_version="0").items
    assert none == [], [p.metadata.name for p in none]
    print("list pods fieldSelector ok", selector, [p.metadata.name for p in pods], "tries", tries, flush=True)

    # A watch from the list's resourceVersion while another thread makes three changes.
    errors = []

    def change():
        try:
            time.sleep(0.5)
            v1.create_namespaced_config_map(ns, configmap("three", {"k": "3"}))
            got = v1.read_namespaced_config_map("one", ns)
            got.data = {"k": "1b"}
            v1.replace_namespaced_config_map("one", ns, got)
            v1.delete_namespaced_config_map("two", ns)
        except Exception as e:  # reported by the main thread
            errors.append(e)

    changer = threading.Thread(target=change, daemon=True)
    changer.start()
    w = watch.Watch()
    seen = []
    deadline = time.monotonic() + 20
    for event in w.stream(v1.list_namespaced_config_map, ns, resource_version=start, timeout_seconds=20):
        seen.append((event["type"], event["object"].metadata.name))
        if seen[-1] == ("DELETED", "two") or time.monotonic() > deadline:
            w.stop()
    changer.join(10)
    assert not errors, errors
    assert seen == [("ADDED", "three"), ("MODIFIED", "one"), ("DELETED", "two")], seen
    print("watch from", start, "ok", seen, flush=True)

    informer_check(v1, ns)


def informer_check(v1, ns):
    """The client's informer (kubernetes.informer.SharedInformer, in releases that have it)
    through the proxy: its first list (resourceVersion=0, as client-go's reflector lists) has
    what is there, and a ConfigMap created after it started reaches its handler and its cache."""
    try:
        from kubernetes import informer
    except ImportError:
        informer = None
    if informer is None:
        return watch_from_zero(v1, ns)

    @functools.wraps(v1.list_namespaced_config_map)
    def list_from_cache(*args, **kwargs):
        if not kwargs.get("watch"):
            kwargs.setdefault("resource_version", "0")
        return v1.list_namespaced_config_map(*args, **kwargs)

    events = queue.Queue()
    inf = informer.SharedInformer(list_from_cache, namespace=ns)
    for kind in (informer.ADDED, informer.MODIFIED, informer.DELETED):
        inf.add_event_handler(kind, lambda obj, kind=kind: events.put((kind, obj.metadata.name)))
    inf.add_event_handler(informer.ERROR, lambda err: events.put(("ERROR", repr(err))))
    inf.start()
    try:
        seen = []

        def next_event(what):
            try:
                ev = events.get(timeout=20)
            except queue.Empty:
                raise AssertionError("the informer: no event within 20 s waiting for %s (seen %s)" % (what, seen))
            seen.append(ev)
            return ev

        # The first list (one and three, maybe in either order) before anything is created.
        while sorted(n for t, n in seen if t == "ADDED") != ["one", "three"]:
            kind, name = next_event("the first list")
            assert kind == "ADDED", seen
        v1.create_namespaced_config_map(ns, configmap("four", {"k": "4"}))
        while next_event("four") != ("ADDED", "four"):
            pass
        keys = sorted(inf.cache.list_keys())
        assert keys == ["%s/%s" % (ns, n) for n in ("four", "one", "three")], keys
        assert ("ERROR" not in [t for t, _ in seen]), seen
        print("informer ok", seen, "cache", keys, flush=True)
    finally:
        # stop() shuts the watch's socket down under the informer's thread, which logs the
        # read it had under way as an error ("Response ended prematurely"): quiet, it is ours.
        logging.getLogger("kubernetes.informer").setLevel(logging.CRITICAL)
        inf.stop()


def watch_from_zero(v1, ns):
    """Without an informer in the client: kubernetes.watch.Watch from resourceVersion=0 (the
    proxy's cache): the objects there first, then a ConfigMap created once it started."""
    w = watch.Watch()
    seen = []
    created = False
    for event in w.stream(v1.list_namespaced_config_map, ns, resource_version="0", timeout_seconds=20):
        seen.append((event["type"], event["object"].metadata.name))
        if not created and sorted(n for t, n in seen if t == "ADDED") == ["one", "three"]:
            v1.create_namespaced_config_map(ns, configmap("four", {"k": "4"}))
            created = True
        if seen[-1] == ("ADDED", "four"):
            w.stop()
    assert created and seen[-1] == ("ADDED", "four"), seen
    print("watch from 0 ok (no informer in this client)", seen, flush=True)


if __name__ == "__main__":
    try:
        main()
    except Exception as e:
        print("FAIL", type(e).__name__, e, flush=True)
        raise
