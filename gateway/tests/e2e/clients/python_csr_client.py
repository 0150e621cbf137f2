"""Requests a certificate with the official Kubernetes Python client (PyPI `kubernetes`).

Usage: python_csr_client.py KUBECONFIG CSR_PEM_FILE NAME
Our group is certificates.svc.io, which the client has no typed API for, so it goes through
CustomObjectsApi and the generic ApiClient.call_api: create a CertificateSigningRequest, see a
422 for a bad one, list by signer, approve through /approval the way kubectl does, wait for
the certificate, delete. Prints one line per check; exits non-zero on any failure.
"""
import base64
import sys
import time

from kubernetes import client, config
from kubernetes.client.rest import ApiException

GROUP, VERSION, PLURAL = "certificates.svc.io", "v1", "certificatesigningrequests"
SIGNER = "svc.io/apiserver-client"


def manifest(name, pem, expiration_seconds):
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "CertificateSigningRequest",
        "metadata": {"name": name},
        "spec": {
            "request": base64.b64encode(pem).decode(),
            "signerName": SIGNER,
            "expirationSeconds": expiration_seconds,
            "usages": ["digital signature", "client auth"],
        },
    }


def put_approval(api_client, name, csr):
    """PUT the request to /approval through the client's generic call path."""
    path = f"/apis/{GROUP}/{VERSION}/{PLURAL}/{{name}}/approval"
    headers = {"Accept": "application/json", "Content-Type": "application/json"}
    if hasattr(api_client, "param_serialize"):
        # Clients generated since v33: serialize, call, deserialize.
        params = api_client.param_serialize(
            method="PUT",
            resource_path=path,
            path_params={"name": name},
            header_params=headers,
            body=csr,
            auth_settings=["BearerToken"],
        )
        response = api_client.call_api(*params)
        response.read()
        return api_client.response_deserialize(response, {"200": "object"}).data
    return api_client.call_api(
        path,
        "PUT",
        path_params={"name": name},
        header_params=headers,
        body=csr,
        auth_settings=["BearerToken"],
        response_type="object",
        _return_http_data_only=True,
    )


def main():
    kubeconfig, pem_file, name = sys.argv[1], sys.argv[2], sys.argv[3]
    config.load_kube_config(config_file=kubeconfig)
    api = client.CustomObjectsApi()
    with open(pem_file, "rb") as f:
        pem = f.read()

    created = api.create_cluster_custom_object(GROUP, VERSION, PLURAL, manifest(name, pem, 3600))
    assert created["spec"]["username"] == "admin", created["spec"]
    assert "status" not in created or not created["status"].get("conditions"), created
    print("create ok", created["metadata"]["resourceVersion"])

    try:
        api.create_cluster_custom_object(GROUP, VERSION, PLURAL, manifest("too-short", pem, 60))
        raise AssertionError("a 60-second request was accepted")
    except ApiException as e:
        assert e.status == 422, e.status
        assert "spec.expirationSeconds" in e.body, e.body
    print("invalid ok")

    listed = api.list_cluster_custom_object(
        GROUP, VERSION, PLURAL, field_selector=f"spec.signerName={SIGNER}"
    )
    assert [i["metadata"]["name"] for i in listed["items"]] == [name], listed["items"]
    print("list ok", listed["metadata"]["resourceVersion"])

    csr = api.get_cluster_custom_object(GROUP, VERSION, PLURAL, name)
    csr.setdefault("status", {}).setdefault("conditions", []).append(
        {
            "type": "Approved",
            "status": "True",
            "reason": "PythonApprove",
            "message": "approved from the Python client",
        }
    )
    approved = put_approval(api.api_client, name, csr)
    condition = approved["status"]["conditions"][0]
    assert condition["type"] == "Approved" and condition["lastTransitionTime"], condition
    print("approve ok")

    deadline = time.time() + 20
    while True:
        got = api.get_cluster_custom_object(GROUP, VERSION, PLURAL, name)
        certificate = got.get("status", {}).get("certificate")
        if certificate:
            break
        assert time.time() < deadline, "never issued"
        time.sleep(0.1)
    assert base64.b64decode(certificate).startswith(b"-----BEGIN CERTIFICATE-----")
    print("issued ok")

    api.delete_cluster_custom_object(GROUP, VERSION, PLURAL, name)
    try:
        api.get_cluster_custom_object(GROUP, VERSION, PLURAL, name)
        raise AssertionError("still there after delete")
    except ApiException as e:
        assert e.status == 404, e.status
    print("delete ok")


if __name__ == "__main__":
    main()
