package proxy

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The client drivers (clients/): the official Python client (PyPI kubernetes, which
// scripts/test.sh installs) and the official JavaScript client (@kubernetes/client-node, pinned
// in clients/node/package.json and installed by `npm ci` into clients/node/node_modules, which
// git ignores, the first time this test runs without it).
const (
	pythonClient = "clients/python_client.py"
	nodeDir      = "clients/node"
)

// TestClientsThroughProxy drives the proxy with the official Python and JavaScript clients:
// creates, lists with resourceVersion=0 and with field selectors, a watch from a list's version
// that sees a create, an update and a delete, and each client's informer; the lists and
// watches of configmaps are served from the proxy's cache, and what the clients wrote is
// upstream. The lists of pods with resourceVersion=0 and field selectors are served from the
// cache too.
func TestClientsThroughProxy(t *testing.T) {
	e := getEnv(t)
	for _, c := range []struct {
		name    string
		prepare func(t *testing.T) []string // the command, less its two arguments
	}{
		{"Python", preparePython},
		{"Node", prepareNode},
	} {
		t.Run(c.name, func(t *testing.T) {
			argv := c.prepare(t)
			from := strings.ToLower(c.name)
			ns := namespace(t, e, "clients-"+from)
			kubeconfig := writeKubeconfig(t, e.proxy)
			before := map[string]float64{}
			for _, key := range []string{"configmaps list", "configmaps watch", "pods list"} {
				r, verb, _ := strings.Cut(key, " ")
				before[key] = cacheReads(t, e, "", r, verb)
			}

			runClient(t, append(argv, kubeconfig, ns))

			for key, n := range before {
				r, verb, _ := strings.Cut(key, " ")
				after := cacheReads(t, e, "", r, verb)
				t.Logf("%s %s served from the proxy's cache: %v", verb, r, after-n)
				if after <= n {
					t.Errorf("the %s client's %s of %s was not served from the proxy's cache (svc_proxy_cache_reads_total stayed at %v)", c.name, verb, r, n)
				}
			}

			// What the client wrote through the proxy is upstream.
			direct := e.clients(t, e.upstream)
			for name, want := range map[string]string{"one": "1b", "three": "3", "four": "4"} {
				cm, err := direct.CoreV1().ConfigMaps(ns).Get(ctx(t), name, metav1.GetOptions{})
				if err != nil {
					t.Errorf("configmap %s upstream: %v", name, err)
					continue
				}
				if cm.Data["k"] != want || cm.Labels["from"] != from {
					t.Errorf("configmap %s upstream: data %v, labels %v; want k=%s, from=%s", name, cm.Data, cm.Labels, want, from)
				}
			}
			if _, err := direct.CoreV1().ConfigMaps(ns).Get(ctx(t), "two", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				t.Errorf("configmap two upstream after its delete: %v", err)
			}
			pod, err := direct.CoreV1().Pods(ns).Get(ctx(t), "p", metav1.GetOptions{})
			if err != nil {
				t.Errorf("pod p upstream: %v", err)
			} else if pod.Spec.NodeName != "" {
				t.Errorf("pod p upstream is on node %q", pod.Spec.NodeName)
			}
			noWatchersLeft(t, e, "configmaps")
		})
	}
}

// runClient runs a client driver (at most 60 s) in the package folder, logs its lines, and
// fails the test if it fails.
func runClient(t *testing.T, argv []string) {
	t.Helper()
	c, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(c, argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), "PYTHONUNBUFFERED=1")
	cmd.WaitDelay = 5 * time.Second
	start := time.Now()
	out, err := cmd.CombinedOutput()
	for _, line := range strings.Split(strings.TrimRight(string(out), "\n"), "\n") {
		t.Log(line)
	}
	if c.Err() != nil {
		t.Fatalf("%s: no end within 60 s (killed)", strings.Join(argv[:2], " "))
	}
	if err != nil {
		t.Fatalf("%s: %v after %s (its output is above)", strings.Join(argv[:2], " "), err, time.Since(start).Round(time.Millisecond))
	}
}

// preparePython: python3 with the kubernetes package. Without it the test fails, unless
// INTEROP_SKIP_PYTHON=1 says to skip.
func preparePython(t *testing.T) []string {
	t.Helper()
	out, err := exec.Command("python3", "-c", "import kubernetes; print(kubernetes.__version__)").CombinedOutput()
	if err != nil {
		if os.Getenv("INTEROP_SKIP_PYTHON") == "1" {
			t.Skipf("INTEROP_SKIP_PYTHON=1 and python3 cannot import kubernetes: %v %s", err, out)
		}
		t.Fatalf("python3 cannot import kubernetes (scripts/test.sh installs it: python3 -m pip install kubernetes; INTEROP_SKIP_PYTHON=1 skips this test): %v\n%s", err, out)
	}
	t.Logf("python kubernetes client %s", strings.TrimSpace(string(out)))
	return []string{"python3", pythonClient}
}

// prepareNode: node, and @kubernetes/client-node at the version package.json pins, installed
// with `npm ci` (from package-lock.json) when node_modules does not have it. Without node, or
// without npm when it must install, the test fails, unless INTEROP_SKIP_NODE=1 says to skip.
func prepareNode(t *testing.T) []string {
	t.Helper()
	missing := func(format string, args ...any) {
		t.Helper()
		if os.Getenv("INTEROP_SKIP_NODE") == "1" {
			t.Skipf("INTEROP_SKIP_NODE=1 and "+format, args...)
		}
		t.Fatalf(format+" (INTEROP_SKIP_NODE=1 skips this test)", args...)
	}
	node, err := exec.LookPath("node")
	if err != nil {
		missing("no node on the PATH: %v", err)
	}
	want, err := pinnedClientNode()
	if err != nil {
		t.Fatal(err)
	}
	if got := installedClientNode(); got != want {
		npm, err := exec.LookPath("npm")
		if err != nil {
			missing("@kubernetes/client-node %s is not installed in %s (found %q) and there is no npm on the PATH: %v", want, nodeDir, got, err)
		}
		t.Logf("installing @kubernetes/client-node %s: npm ci in %s", want, nodeDir)
		c, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(c, npm, "ci", "--prefix", nodeDir, "--no-audit", "--no-fund")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("npm ci --prefix %s: %v\n%s", nodeDir, err, out)
		}
		if got := installedClientNode(); got != want {
			t.Fatalf("after npm ci, %s/node_modules has @kubernetes/client-node %q, package.json pins %s", nodeDir, got, want)
		}
	}
	out, _ := exec.Command(node, "--version").Output()
	t.Logf("node %s, @kubernetes/client-node %s", strings.TrimSpace(string(out)), want)
	return []string{node, filepath.Join(nodeDir, "client.mjs")}
}

// pinnedClientNode is the version of @kubernetes/client-node that clients/node/package.json
// names (an exact version).
func pinnedClientNode() (string, error) {
	var pkg struct {
		Dependencies map[string]string `json:"dependencies"`
	}
	b, err := os.ReadFile(filepath.Join(nodeDir, "package.json"))
	if err == nil {
		err = json.Unmarshal(b, &pkg)
	}
	if err != nil {
		return "", err
	}
	v := pkg.Dependencies["@kubernetes/client-node"]
	if v == "" {
		return "", errors.New(nodeDir + "/package.json: no @kubernetes/client-node")
	}
	return v, nil
}

// installedClientNode is the version of @kubernetes/client-node in clients/node/node_modules
// ("" when there is none).
func installedClientNode() string {
	var pkg struct {
		Version string `json:"version"`
	}
	b, err := os.ReadFile(filepath.Join(nodeDir, "node_modules", "@kubernetes", "client-node", "package.json"))
	if err != nil || json.Unmarshal(b, &pkg) != nil {
		return ""
	}
	return pkg.Version
}
