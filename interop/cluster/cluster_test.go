// Package cluster runs a workload in the shape of clusterloader2's on a simulated cluster
// (interop/cluster.sh: kube-controller-manager, kube-scheduler, hollow kubelets and hollow
// kube-proxies from kubemark, each with its own identity), pointed at kube-apiserver directly or
// at svc-gateway proxies in front of it, and times what the components do: a Deployment whose
// pods mount a ConfigMap and a Secret started, rolled, scaled down and deleted, and beside
// it pods created one by one at a steady rate, for the pod startup SLO.
//
// The environment interop/run.sh (or a user) sets:
//
//	CLUSTER_KUBECONFIG   the admin's kubeconfig for the target (the proxy's in proxy mode)
//	CLUSTER_MODE         direct or proxy, for the report
//	CLUSTER_NODES        how many hollow nodes are Ready (default 3)
//	CLUSTER_PODS         the Deployment's replicas (default 10 per node)
//	CLUSTER_LATENCY_PODS pods created one by one while the Deployment runs, for the pod
//	                     startup SLO (default a tenth of CLUSTER_PODS, 10 to 100)
//	CLUSTER_LATENCY_QPS  how many of them a second (default 5)
//	CLUSTER_UPSTREAM_KUBECONFIG  the admin's kubeconfig for kube-apiserver itself: its
//	                     /metrics are read before and after the workload (CPU seconds,
//	                     resident memory, watches open)
//
// Without CLUSTER_KUBECONFIG the test is skipped, so `go test ./...` works anywhere.
package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"math/rand"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	typedappsv1 "k8s.io/client-go/kubernetes/typed/apps/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	watchtools "k8s.io/client-go/tools/watch"
)

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

func client(t *testing.T) kubernetes.Interface {
	t.Helper()
	path := os.Getenv("CLUSTER_KUBECONFIG")
	if path == "" {
		t.Skip("CLUSTER_KUBECONFIG is not set (interop/run.sh sets it)")
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		t.Fatal(err)
	}
	cfg.QPS, cfg.Burst = 100, 200
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// startups records, for each pod of a namespace that a label selector picks, when a watcher
// saw it first and when it saw it Running: the pod startup latency as clusterloader2 measures
// it.
type startups struct {
	mu      sync.Mutex
	added   map[types.UID]time.Time
	running map[types.UID]time.Duration
	// From first seen to first seen bound to a node (the scheduler's part), for the pods
	// seen running.
	bound map[types.UID]time.Duration
	// Where each pod ran, for the slowest.
	node map[types.UID]string
}

func watchStartups(ctx context.Context, t *testing.T, c kubernetes.Interface, ns, selector string) *startups {
	t.Helper()
	s := &startups{added: map[types.UID]time.Time{}, running: map[types.UID]time.Duration{},
		bound: map[types.UID]time.Duration{}, node: map[types.UID]string{}}
	list, err := c.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		t.Fatal(err)
	}
	// Resumed from the last version seen whenever the server ends the watch.
	w, err := watchtools.NewRetryWatcherWithContext(ctx, list.ResourceVersion, &cache.ListWatch{
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.LabelSelector = selector
			return c.CoreV1().Pods(ns).Watch(ctx, o)
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		defer w.Stop()
		for ev := range w.ResultChan() {
			pod, ok := ev.Object.(*corev1.Pod)
			if !ok || ev.Type == watch.Deleted {
				continue
			}
			now := time.Now()
			s.mu.Lock()
			if _, seen := s.added[pod.UID]; !seen {
				s.added[pod.UID] = now
			}
			if _, seen := s.bound[pod.UID]; !seen && pod.Spec.NodeName != "" {
				s.bound[pod.UID] = now.Sub(s.added[pod.UID])
			}
			if _, done := s.running[pod.UID]; !done && pod.Status.Phase == corev1.PodRunning {
				s.running[pod.UID] = now.Sub(s.added[pod.UID])
				s.node[pod.UID] = pod.Spec.NodeName
			}
			s.mu.Unlock()
		}
	}()
	return s
}

func (s *startups) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.running)
}

// slowest are the n slowest startups so far, with their nodes.
func (s *startups) slowest(n int) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	uids := make([]types.UID, 0, len(s.running))
	for uid := range s.running {
		uids = append(uids, uid)
	}
	sort.Slice(uids, func(i, j int) bool { return s.running[uids[i]] > s.running[uids[j]] })
	var out []string
	for _, uid := range uids[:min(n, len(uids))] {
		out = append(out, fmt.Sprintf("%s %v", s.node[uid], s.running[uid].Round(time.Millisecond)))
	}
	return out
}

// quantiles of the startups so far: p50, p99.
func (s *startups) quantiles() (time.Duration, time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return quantiles(s.running)
}

// parts are the p50 and p99 of the two parts of the startups so far: until the pod was seen
// bound to a node (the scheduler's), and from then until it was seen running (the node's).
func (s *startups) parts() (bound, run [2]time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	after := map[types.UID]time.Duration{}
	for uid, r := range s.running {
		if b, ok := s.bound[uid]; ok {
			after[uid] = r - b
		}
	}
	b50, b99 := quantiles(s.bound)
	r50, r99 := quantiles(after)
	return [2]time.Duration{b50, b99}, [2]time.Duration{r50, r99}
}

func quantiles(m map[types.UID]time.Duration) (time.Duration, time.Duration) {
	var d []time.Duration
	for _, v := range m {
		d = append(d, v)
	}
	if len(d) == 0 {
		return 0, 0
	}
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	at := func(q float64) time.Duration { return d[int(q*float64(len(d)-1))] }
	return at(0.5), at(0.99)
}

// until polls cond every 200 ms until it holds (nil), or fails the test after limit.
func until(ctx context.Context, t *testing.T, limit time.Duration, what string, cond func() (bool, error)) time.Duration {
	t.Helper()
	start := time.Now()
	var last error
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, limit, true, func(context.Context) (bool, error) {
		ok, err := cond()
		if err != nil {
			last = err
			return false, nil
		}
		return ok, nil
	})
	if err != nil {
		t.Fatalf("%s: not within %v (last error: %v)", what, limit, last)
	}
	return time.Since(start)
}

// scrape is what kube-apiserver's own /metrics say: its CPU seconds, resident memory, the
// watches open on it (long-running WATCH requests), and its request latency SLI histogram
// (apiserver_request_sli_duration_seconds) summed by class of call.
type scrape struct {
	cpu, rss, watches float64
	// buckets[class][le] = cumulative count.
	buckets map[string]map[float64]float64
	// requests["VERB resource/subresource"] = apiserver_request_total summed over codes.
	requests map[string]float64
}

// label is the value of name in a Prometheus series' labels.
func label(series, name string) string {
	_, rest, ok := strings.Cut(series, name+`="`)
	if !ok {
		return ""
	}
	v, _, _ := strings.Cut(rest, `"`)
	return v
}

// class of a call, as the Kubernetes API call latency SLOs group them: mutating calls,
// single-object reads, and lists.
func class(labels string) string {
	switch {
	case strings.Contains(labels, `verb="POST"`), strings.Contains(labels, `verb="PUT"`),
		strings.Contains(labels, `verb="PATCH"`), strings.Contains(labels, `verb="DELETE"`):
		return "mutating"
	case strings.Contains(labels, `verb="GET"`):
		return "get"
	case strings.Contains(labels, `verb="LIST"`):
		return "list"
	}
	return ""
}

func upstreamMetrics(ctx context.Context, t *testing.T) (scrape, bool) {
	t.Helper()
	s := scrape{buckets: map[string]map[float64]float64{}, requests: map[string]float64{}}
	path := os.Getenv("CLUSTER_UPSTREAM_KUBECONFIG")
	if path == "" {
		return s, false
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		t.Fatal(err)
	}
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	body, err := c.Discovery().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		t.Fatalf("kube-apiserver's /metrics: %v", err)
	}
	for _, line := range strings.Split(string(body), "\n") {
		name, value, found := strings.Cut(line, " ")
		if !found || strings.HasPrefix(line, "#") {
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(value), 64)
		if err != nil {
			continue
		}
		switch {
		case name == "process_cpu_seconds_total":
			s.cpu = v
		case name == "process_resident_memory_bytes":
			s.rss = v
		case strings.HasPrefix(name, "apiserver_request_total{"):
			key := label(name, "verb") + " " + label(name, "resource")
			if sub := label(name, "subresource"); sub != "" {
				key += "/" + sub
			}
			s.requests[key] += v
		case strings.HasPrefix(name, "apiserver_longrunning_requests{") && strings.Contains(name, `verb="WATCH"`):
			s.watches += v
		case strings.HasPrefix(name, "apiserver_request_sli_duration_seconds_bucket{"):
			cl := class(name)
			_, le, ok := strings.Cut(name, `le="`)
			if cl == "" || !ok {
				continue
			}
			bound, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSuffix(le, "}"), `"`), 64)
			if err != nil {
				bound = math.Inf(1)
			}
			if s.buckets[cl] == nil {
				s.buckets[cl] = map[float64]float64{}
			}
			s.buckets[cl][bound] += v
		}
	}
	return s, true
}

// sliP99 is the p99 of a class's calls between two scrapes: the upper bound of the first
// bucket holding 99 % of them (histogram_quantile without interpolation; -1 past the last
// bound), and how many there were.
func sliP99(before, after scrape, cl string) (time.Duration, int) {
	var bounds []float64
	for b := range after.buckets[cl] {
		bounds = append(bounds, b)
	}
	sort.Float64s(bounds)
	if len(bounds) == 0 {
		return 0, 0
	}
	delta := func(b float64) float64 { return after.buckets[cl][b] - before.buckets[cl][b] }
	total := delta(bounds[len(bounds)-1])
	for _, b := range bounds {
		if delta(b) >= 0.99*total {
			if math.IsInf(b, 1) {
				return -1, int(total)
			}
			return time.Duration(b * float64(time.Second)), int(total)
		}
	}
	return -1, int(total)
}

// scaled stretches a time limit written for up to 500 pods to a workload of pods.
func scaled(pods int) func(time.Duration) time.Duration {
	return func(d time.Duration) time.Duration {
		return d * time.Duration(max(1, (pods+499)/500))
	}
}

func TestWorkload(t *testing.T) {
	c := client(t)
	mode := os.Getenv("CLUSTER_MODE")
	nodes := envInt("CLUSTER_NODES", 3)
	pods := envInt("CLUSTER_PODS", 10*nodes)
	limit := scaled(pods)
	ctx, cancel := context.WithTimeout(context.Background(), limit(8*time.Minute))
	defer cancel()

	// Every hollow node Ready, each with a lease its kubelet renews.
	until(ctx, t, 2*time.Minute, "every hollow node Ready", func() (bool, error) {
		list, err := c.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		ready := 0
		for _, n := range list.Items {
			for _, cond := range n.Status.Conditions {
				if cond.Type == corev1.NodeReady && cond.Status == corev1.ConditionTrue {
					ready++
				}
			}
		}
		return ready >= nodes, nil
	})

	before, measured := upstreamMetrics(ctx, t)
	ns := workloadNamespace(ctx, t, c, "wl")
	if _, err := c.CoreV1().Services(ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: corev1.ServiceSpec{
			Selector: map[string]string{"app": "web"},
			Ports:    []corev1.ServicePort{{Port: 80}},
		},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	starts := watchStartups(ctx, t, c, ns, "app=web")

	replicas := int32(pods)
	dep := deployment(replicas)
	deployments := c.AppsV1().Deployments(ns)
	if _, err := deployments.Create(ctx, dep, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	rolledOut := func(want int32) func() (bool, error) { return available(ctx, deployments, want) }
	start := until(ctx, t, limit(4*time.Minute), "the Deployment available", rolledOut(replicas))
	until(ctx, t, limit(time.Minute), "every pod seen Running by a watcher", func() (bool, error) {
		return starts.count() >= pods, nil
	})
	p50, p99 := starts.quantiles()
	t.Logf("cluster: mode=%s slowest startups: %s", mode, strings.Join(starts.slowest(8), ", "))
	bound, ran := starts.parts()
	t.Logf("cluster: mode=%s startup parts: to_bound_p50=%v to_bound_p99=%v bound_to_running_p50=%v bound_to_running_p99=%v",
		mode, bound[0].Round(time.Millisecond), bound[1].Round(time.Millisecond), ran[0].Round(time.Millisecond), ran[1].Round(time.Millisecond))

	// Its Service's EndpointSlice lists every pod (the EndpointSlice controller).
	until(ctx, t, limit(time.Minute), "the EndpointSlice of every pod", func() (bool, error) {
		list, err := c.DiscoveryV1().EndpointSlices(ns).List(ctx, metav1.ListOptions{LabelSelector: "kubernetes.io/service-name=web"})
		if err != nil {
			return false, err
		}
		n := 0
		for _, s := range list.Items {
			n += len(s.Endpoints)
		}
		return n == pods, nil
	})

	// The pod startup SLO, measured as clusterloader2's density test does: apart from the
	// burst above, whose startups are the scheduler's throughput (its QPS over thousands of
	// pods), pods created one by one at a steady rate while the Deployment runs.
	latency := latencyPods(ctx, t, c, ns, envInt("CLUSTER_LATENCY_PODS", min(100, max(10, pods/10))),
		envInt("CLUSTER_LATENCY_QPS", 5), limit(2*time.Minute))
	l50, l99 := latency.quantiles()
	lb, lr := latency.parts()
	t.Logf("cluster: mode=%s latency_pods=%d startup_p50=%v startup_p99=%v to_bound_p99=%v bound_to_running_p99=%v slowest: %s",
		mode, latency.count(), l50.Round(time.Millisecond), l99.Round(time.Millisecond), lb[1].Round(time.Millisecond),
		lr[1].Round(time.Millisecond), strings.Join(latency.slowest(4), ", "))

	// A rolling update: the controller manager waits for its informers to see its own writes,
	// so a slow watch shows here.
	patch := fmt.Sprintf(`{"spec":{"template":{"metadata":{"annotations":{"rolled":"%d"}}}}}`, time.Now().UnixNano())
	if _, err := deployments.Patch(ctx, "web", types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	roll := until(ctx, t, limit(4*time.Minute), "the rolling update", rolledOut(replicas))

	down := replicas / 3
	if _, err := deployments.Patch(ctx, "web", types.MergePatchType, fmt.Appendf(nil, `{"spec":{"replicas":%d}}`, down), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	scale := until(ctx, t, limit(2*time.Minute), "the scale down", rolledOut(down))

	if err := deployments.Delete(ctx, "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	gone := until(ctx, t, limit(2*time.Minute), "every pod gone", func() (bool, error) {
		list, err := c.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		return len(list.Items) == 0, nil
	})

	// Every node's lease renewed in the last 40 s (kubelets renew every 10 s).
	leases, err := c.CoordinationV1().Leases("kube-node-lease").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	fresh := 0
	for _, l := range leases.Items {
		if renewed(l, 40*time.Second) {
			fresh++
		}
	}
	if fresh < nodes {
		t.Errorf("%d of %d node leases renewed in the last 40 s", fresh, nodes)
	}
	t.Logf("cluster: mode=%s nodes=%d pods=%d startup_p50=%v startup_p99=%v available=%v rollout=%v scale_down=%v delete=%v",
		mode, nodes, pods, p50.Round(time.Millisecond), p99.Round(time.Millisecond), start.Round(time.Millisecond),
		roll.Round(time.Millisecond), scale.Round(time.Millisecond), gone.Round(time.Millisecond))
	if measured {
		after, _ := upstreamMetrics(ctx, t)
		t.Logf("upstream: mode=%s cpu_seconds=%.1f rss_mib=%.0f watches_before=%.0f watches_after=%.0f",
			mode, after.cpu-before.cpu, after.rss/(1<<20), before.watches, after.watches)
		for _, cl := range []string{"mutating", "get", "list"} {
			q, n := sliP99(before, after, cl)
			t.Logf("upstream sli: mode=%s class=%s calls=%d p99<=%v", mode, cl, n, q)
		}
		// What kube-apiserver was asked, most first.
		type count struct {
			key string
			n   float64
		}
		var counts []count
		for k, v := range after.requests {
			if d := v - before.requests[k]; d > 0 {
				counts = append(counts, count{k, d})
			}
		}
		sort.Slice(counts, func(i, j int) bool { return counts[i].n > counts[j].n })
		for _, c := range counts[:min(len(counts), 15)] {
			t.Logf("upstream requests: mode=%s %s %.0f", mode, c.key, c.n)
		}
	}
	if p99 > 5*time.Second {
		t.Errorf("pod startup p99 %v, over 5 s", p99)
	}
	if l99 > 5*time.Second {
		t.Errorf("latency pods' startup p99 %v, over 5 s", l99)
	}
}

// latencyPods creates n pods named lat-I (labelled app=lat, so neither the Deployment nor
// its Service picks them) at qps a second, each mounting the namespace's ConfigMap and
// Secret as the Deployment's do, waits until a watcher has seen every one Running, deletes
// them, and returns their startups.
func latencyPods(ctx context.Context, t *testing.T, c kubernetes.Interface, ns string, n, qps int, limit time.Duration) *startups {
	t.Helper()
	starts := watchStartups(ctx, t, c, ns, "app=lat")
	pod := deployment(1).Spec.Template
	pod.Labels = map[string]string{"app": "lat"}
	tick := time.NewTicker(time.Second / time.Duration(qps))
	defer tick.Stop()
	for i := range n {
		<-tick.C
		p := &corev1.Pod{ObjectMeta: pod.ObjectMeta, Spec: pod.Spec}
		p.Name = fmt.Sprintf("lat-%d", i)
		if _, err := c.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	until(ctx, t, limit, "every latency pod seen Running by a watcher", func() (bool, error) {
		return starts.count() >= n, nil
	})
	if err := c.CoreV1().Pods(ns).DeleteCollection(ctx, metav1.DeleteOptions{},
		metav1.ListOptions{LabelSelector: "app=lat"}); err != nil {
		t.Fatal(err)
	}
	return starts
}

// workloadNamespace creates a namespace named after prefix (deleted when the test ends), waits
// for its default ServiceAccount (the controller manager's), and creates the ConfigMap
// "config" and the Secret "secret" the workload's pods mount.
func workloadNamespace(ctx context.Context, t *testing.T, c kubernetes.Interface, prefix string) string {
	t.Helper()
	ns := fmt.Sprintf("%s-%d", prefix, rand.Intn(1_000_000))
	if _, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = c.CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{})
	})
	until(ctx, t, time.Minute, "the default ServiceAccount", func() (bool, error) {
		_, err := c.CoreV1().ServiceAccounts(ns).Get(ctx, "default", metav1.GetOptions{})
		return err == nil, nil
	})
	if _, err := c.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "config"}, Data: map[string]string{"a": "1"},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "secret"}, StringData: map[string]string{"b": "2"},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return ns
}

// deployment is the workload's Deployment "web": pods that mount a ConfigMap "config" and a
// Secret "secret".
func deployment(replicas int32) *appsv1.Deployment {
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: appsv1.DeploymentSpec{
			Replicas: &replicas,
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}},
			Strategy: appsv1.DeploymentStrategy{RollingUpdate: &appsv1.RollingUpdateDeployment{}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "web"}},
				Spec: corev1.PodSpec{
					Containers: []corev1.Container{{
						Name:  "c",
						Image: "registry.k8s.io/pause:3.10",
						VolumeMounts: []corev1.VolumeMount{
							{Name: "config", MountPath: "/config"},
							{Name: "secret", MountPath: "/secret"},
						},
					}},
					Volumes: []corev1.Volume{
						{Name: "config", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
							LocalObjectReference: corev1.LocalObjectReference{Name: "config"}}}},
						{Name: "secret", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "secret"}}},
					},
				},
			},
		},
	}
}

// available holds once the Deployment "web" has rolled out want replicas, all available.
func available(ctx context.Context, deployments typedappsv1.DeploymentInterface, want int32) func() (bool, error) {
	return func() (bool, error) {
		d, err := deployments.Get(ctx, "web", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		s := d.Status
		return s.ObservedGeneration >= d.Generation && s.UpdatedReplicas == want &&
			s.AvailableReplicas == want && s.Replicas == want, nil
	}
}

func renewed(l coordinationv1.Lease, within time.Duration) bool {
	return l.Spec.RenewTime != nil && time.Since(l.Spec.RenewTime.Time) < within
}

// sims are the simulated nodes' processes (cmd/simnodes), each answering on the address
// cluster.sh wrote to CLUSTER_DIR/simnodes-I.addr.
func sims(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(os.Getenv("CLUSTER_DIR"), "simnodes-*.addr"))
	if err != nil {
		t.Fatal(err)
	}
	var addrs []string
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		addrs = append(addrs, "http://"+strings.TrimSpace(string(b)))
	}
	return addrs
}

// simGet sums a JSON object of numbers over every simnodes process.
func simGet(ctx context.Context, t *testing.T, path string) (map[string]int64, error) {
	t.Helper()
	sum := map[string]int64{}
	for _, a := range sims(t) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, a+path, nil)
		if err != nil {
			return nil, err
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return nil, err
		}
		var one map[string]any
		err = json.NewDecoder(resp.Body).Decode(&one)
		resp.Body.Close()
		if err != nil {
			return nil, fmt.Errorf("%s%s: %w", a, path, err)
		}
		for k, v := range one {
			switch v := v.(type) {
			case float64:
				sum[k] += int64(v)
			case map[string]any:
				for k2, v2 := range v {
					if f, ok := v2.(float64); ok {
						sum[k+"."+k2] += int64(f)
					}
				}
			}
		}
	}
	return sum, nil
}

// clusterScript runs interop/cluster.sh with args on CLUSTER_DIR.
func clusterScript(t *testing.T, args ...string) {
	t.Helper()
	cmd := exec.Command("../cluster.sh", append([]string{args[0], os.Getenv("CLUSTER_DIR")}, args[1:]...)...)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("cluster.sh %v: %v", args, err)
	}
}

// TestFaults runs a Deployment, then restarts kube-apiserver and (through proxies) kills the
// first proxy with SIGKILL and starts it again, and counts what the simulated nodes' informers
// went through for each: syncs from scratch past their first (relists), 410s, and the time
// until every one of them holds a Service created after the fault. At the end every informer's
// store is compared with a direct list of kube-apiserver.
func TestFaults(t *testing.T) {
	c := client(t)
	if os.Getenv("CLUSTER_DIR") == "" || len(sims(t)) == 0 {
		t.Skip("needs CLUSTER_DIR with simulated nodes (cluster.sh with CLUSTER_SIM_NODES)")
	}
	mode := os.Getenv("CLUSTER_MODE")
	pods := envInt("CLUSTER_FAULT_PODS", envInt("CLUSTER_PODS", 10)/2)
	limit := scaled(pods)
	ctx, cancel := context.WithTimeout(context.Background(), limit(8*time.Minute))
	defer cancel()
	ns := workloadNamespace(ctx, t, c, "faults")
	if _, err := c.AppsV1().Deployments(ns).Create(ctx, deployment(int32(pods)), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	until(ctx, t, limit(4*time.Minute), "the Deployment available", available(ctx, c.AppsV1().Deployments(ns), int32(pods)))

	// marker creates a Service (retried while the target comes back) and returns how long
	// until every simulated node's Service informers hold it.
	marker := func(name string) time.Duration {
		start := time.Now()
		until(ctx, t, 2*time.Minute, "creating Service "+name, func() (bool, error) {
			_, err := c.CoreV1().Services(ns).Create(ctx, &corev1.Service{
				ObjectMeta: metav1.ObjectMeta{Name: name},
				Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80}}},
			}, metav1.CreateOptions{})
			return err == nil || apierrors.IsAlreadyExists(err), err
		})
		until(ctx, t, 3*time.Minute, "every simulated node's informers holding Service "+name, func() (bool, error) {
			s, err := simGet(ctx, t, "/seen?resource=services&namespace="+ns+"&name="+name)
			if err != nil {
				return false, err
			}
			return s["informers"] > 0 && s["have"] == s["informers"], nil
		})
		return time.Since(start)
	}
	marker("before")
	fault := func(name string, do func()) {
		before, err := simGet(ctx, t, "/counts")
		if err != nil {
			t.Fatal(err)
		}
		beforeBy, err := simGet(ctx, t, "/by")
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		do()
		down := time.Since(start)
		synced := marker("after-" + name)
		// Stragglers that relist after the marker arrived are counted too.
		time.Sleep(5 * time.Second)
		after, err := simGet(ctx, t, "/counts")
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("fault: mode=%s fault=%s nodes=%d informers=%d relists=%d gone=%d fault_s=%.1f synced_after_s=%.1f",
			mode, name, after["nodes"], after["informers"], (after["syncs"]-before["syncs"])-(after["built"]-before["built"]),
			after["gone"]-before["gone"], down.Seconds(), synced.Seconds())
		afterBy, err := simGet(ctx, t, "/by")
		if err != nil {
			t.Fatal(err)
		}
		var by []string
		for k, v := range afterBy {
			if d := v - beforeBy[k]; d != 0 {
				by = append(by, fmt.Sprintf("%s=%d", k, d))
			}
		}
		sort.Strings(by)
		t.Logf("fault: fault=%s by kind: %s", name, strings.Join(by, " "))
	}
	fault("upstream-restart", func() { clusterScript(t, "restart-upstream") })
	if mode == "proxy" {
		fault("proxy-sigkill", func() { clusterScript(t, "kill-proxy", "0") })
	}

	// Every store as kube-apiserver has it, once the last writes have arrived.
	var last map[string]int64
	var lastErr error
	_ = wait.PollUntilContextTimeout(ctx, 2*time.Second, time.Minute, true, func(context.Context) (bool, error) {
		last, lastErr = simGet(ctx, t, "/compare")
		return lastErr == nil && last["differ"] == 0, nil
	})
	if lastErr != nil {
		t.Fatalf("comparing the stores: %v", lastErr)
	}
	t.Logf("stores: mode=%s informers=%d objects=%d differ=%d stores_differ=%d", mode, last["informers"], last["objects"], last["differ"], last["stores_differ"])
	var how []string
	for k, v := range last {
		if strings.HasPrefix(k, "by.") {
			how = append(how, fmt.Sprintf("%s=%d", strings.TrimPrefix(k, "by."), v))
		}
	}
	sort.Strings(how)
	t.Logf("stores: mode=%s differ by resource and how: %s", mode, strings.Join(how, " "))
	if last["differ"] != 0 {
		t.Errorf("%d objects in %d simulated nodes' informer stores differ from kube-apiserver's", last["differ"], last["stores_differ"])
	}
}
