// Package proxy holds the tests of the svc gateway in proxy mode (--upstream-kubeconfig) in front
// of a real kube-apiserver: client-go and kubectl through the proxy on pods, configmaps and a
// CRD, the caller's identity upstream (client certificates, ServiceAccount tokens, RBAC, and
// impersonation), and watches passed through.
package proxy
