// Package diff is the differential runner: it sends the same scripted requests to
// kube-apiserver and to the svc gateway, both running at once, and compares their answers
// after normalising what may differ between any two servers (uids, timestamps, resource
// version values, generated names, the gateway's svc.io group names).
//
// A scenario is a list of steps (scenarios_*_test.go); each step is one request, sent to both
// servers, and one test case (TestDiff/<scenario>/<step>). A case fails on any difference that
// is not explained: explained differences are the entries of ../DIFFERENCES.md (each with an
// id), matched to a case and a field path by the table in explained_test.go. An explained
// difference that no longer occurs fails too (TestDiff/explained), so the list stays true.
//
// Environment (interop/run.sh sets it; without it every test is skipped):
//
//	INTEROP_DIFF_KUBE_KUBECONFIG     kube-apiserver's admin kubeconfig
//	INTEROP_DIFF_GATEWAY_KUBECONFIG  the gateway's admin kubeconfig
//	INTEROP_DIFF_VERBOSE=1           log every request and both normalised answers
//	INTEROP_DIFF_REPORT=FILE         write every unexplained difference to FILE, one a line:
//	                                 case, path, kube-apiserver's value, the gateway's
//	INTEROP_DIFF_GATEWAY_SUFFIX      the second server's group suffix (default svc.io); k8s.io
//	                                 with a second kube-apiserver in its place checks that the
//	                                 normalisation leaves no noise between two identical servers
package diff
