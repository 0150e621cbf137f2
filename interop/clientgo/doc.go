// Package clientgo holds client-go conformance tests that run against kube-apiserver and the svc gateway.
package clientgo
