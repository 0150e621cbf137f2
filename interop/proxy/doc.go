// Package proxy holds the tests of the svc gateway in proxy mode (--upstream-kubeconfig) in front
// of a real kube-apiserver: client-go and kubectl through the proxy on pods, configmaps and a
// CRD, the caller's identity upstream (client certificates, ServiceAccount tokens, RBAC, and
// impersonation), and watches passed through; the official Python and JavaScript clients
// through the proxy (clients_test.go, drivers in clients/); and the proxy's caches of the upstream
// (cache_test.go): informers, lists and watches served from them compared with the upstream's
// answers, RBAC on cached reads, CRDs coming and going, many watches on one upstream watch
// (cache_fanout_test.go), a restart of the upstream (zz_restart_test.go) and one of the proxy
// (zzz_proxy_restart_test.go, last).
package proxy
