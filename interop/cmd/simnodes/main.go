// Command simnodes runs many simulated nodes in one process, for the simulated cluster of
// interop/cluster.sh where thousands of hollow kubelets would not fit in memory. Each node is a
// client of its own, with its own client certificate (CN system:node:<name>, O system:nodes,
// minted from the cluster CA), so the Node authorizer and NodeRestriction judge it as they
// judge a kubelet, and its own connection. Each makes the requests a kubelet and a kube-proxy
// make, as the hollow kubelets and kube-proxies of the same cluster were seen making them:
//
//   - registers its Node (Ready, 110 pods) and renews its Lease in kube-node-lease every 10 s
//     (a PUT of the lease it last wrote, a GET only after that fails, as the kubelet does);
//     posts its Node's status again when its Node says other than Ready (the node lifecycle
//     controller marked it Unknown after its lease lapsed) or 5 minutes after the last report,
//     as the kubelet does;
//
//   - informers of its pods (fieldSelector spec.nodeName), its own Node (metadata.name),
//     Services, RuntimeClasses and CSIDrivers (the kubelet's), and EndpointSlices and
//     ServiceCIDRs (the kube-proxy's), protobuf as both ask;
//
//   - for each pod bound to it, a single-object informer per ConfigMap and Secret its
//     volumes name (the kubelet's watch-based ConfigMap and Secret managers) and a token for
//     its projected ServiceAccount volume, then its status patched to Running once they have
//     synced, as a runtime that starts at once would; a pod being deleted is deleted for good
//     (grace 0), as the kubelet does once its containers stopped.
//
//     simnodes --server URL --ca CA.crt --client-ca CA.crt --client-ca-key CA.key --nodes 1000
//
// With --status-addr it answers the cluster tests: how often its informers synced from scratch
// and were answered 410, which hold a given object, and how their stores compare with a
// direct list (stats.go).
//
// It runs until SIGTERM or SIGINT, then deletes nothing (the nodes go NotReady as their leases
// expire).
package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"flag"
	"fmt"
	"log"
	"math/big"
	"os"
	"os/signal"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	nodev1 "k8s.io/api/node/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
)

func main() {
	server := flag.String("server", "", "the API server (or proxy) URL")
	caFile := flag.String("ca", "", "the CA of the server's serving certificate")
	clientCA := flag.String("client-ca", "", "the cluster CA, whose key signs the nodes' certificates")
	clientCAKey := flag.String("client-ca-key", "", "the cluster CA's key")
	nodes := flag.Int("nodes", 100, "how many nodes")
	first := flag.Int("first", 0, "the first node's number (names are <prefix><n>)")
	prefix := flag.String("prefix", "sim-node-", "the nodes' name prefix")
	startRate := flag.Int("start-rate", 50, "nodes started per second")
	statusAddr := flag.String("status-addr", "", "where to answer /counts, /seen and /compare (see stats.go)")
	compareKubeconfig := flag.String("compare-kubeconfig", "", "kube-apiserver's own admin kubeconfig, for /compare")
	flag.Parse()
	if *server == "" || *caFile == "" || *clientCA == "" || *clientCAKey == "" {
		flag.Usage()
		os.Exit(2)
	}
	serverCA, err := os.ReadFile(*caFile)
	if err != nil {
		log.Fatal(err)
	}
	signer, err := loadCA(*clientCA, *clientCAKey)
	if err != nil {
		log.Fatal(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	var running, podsRunning atomic.Int64
	st := &stats{relistsBy: map[string]int64{}, goneBy: map[string]int64{}, reasons: map[string]int64{}}
	if *statusAddr != "" {
		if err := st.serve(*statusAddr, *compareKubeconfig, &running); err != nil {
			log.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	tick := time.NewTicker(time.Second / time.Duration(max(*startRate, 1)))
	defer tick.Stop()
	for i := *first; i < *first+*nodes; i++ {
		select {
		case <-ctx.Done():
		case <-tick.C:
		}
		if ctx.Err() != nil {
			break
		}
		name := fmt.Sprintf("%s%d", *prefix, i)
		config := func(cn, org, agent string) *rest.Config {
			certPEM, keyPEM, err := signer.mint(cn, org)
			if err != nil {
				log.Fatal(err)
			}
			cfg := &rest.Config{
				Host:            *server,
				TLSClientConfig: rest.TLSClientConfig{CAData: serverCA, CertData: certPEM, KeyData: keyPEM},
				QPS:             10,
				Burst:           20,
				UserAgent:       agent + "/" + name,
			}
			cfg.ContentConfig.ContentType = "application/vnd.kubernetes.protobuf"
			return cfg
		}
		kubelet := config("system:node:"+name, "system:nodes", "simnodes-kubelet")
		proxy := config("system:kube-proxy", "", "simnodes-kube-proxy")
		wg.Add(1)
		go func() {
			defer wg.Done()
			n := &node{name: name, podsRunning: &podsRunning, stats: st}
			if err := n.run(ctx, kubelet, proxy, &running); err != nil && ctx.Err() == nil {
				log.Printf("%s: %v", name, err)
			}
		}()
	}
	log.Printf("simnodes: %d nodes started", running.Load())
	report := time.NewTicker(30 * time.Second)
	defer report.Stop()
	for {
		select {
		case <-ctx.Done():
			wg.Wait()
			return
		case <-report.C:
			log.Printf("simnodes: %d nodes running, %d pods set Running", running.Load(), podsRunning.Load())
		}
	}
}

// node is one simulated node: a kubelet's and a kube-proxy's requests under its identity.
type node struct {
	name        string
	client      kubernetes.Interface
	podsRunning *atomic.Int64
	stats       *stats
	// The lease as last written (read and written by run's goroutine alone).
	lease *coordinationv1.Lease
	// The single-object informers of ConfigMaps and Secrets its pods mount, by
	// kind/ns/name, each stopped once no pod of the node mounts it (the kubelet's
	// watch-based managers), and what each pod mounts.
	mu      sync.Mutex
	objects map[string]*mounted
	mounts  map[types.UID][]string
}

func (n *node) run(ctx context.Context, kubelet, kubeProxy *rest.Config, running *atomic.Int64) error {
	c, err := kubernetes.NewForConfig(kubelet)
	if err != nil {
		return err
	}
	n.client = c
	p, err := kubernetes.NewForConfig(kubeProxy)
	if err != nil {
		return err
	}
	// Registered as the kubelet registers: tried again, 100 ms doubling up to 7 s apart,
	// until it is done (a 429 from a busy server is not the end of a node).
	always := func(err error) bool {
		log.Printf("%s: registering: %v", n.name, err)
		return true
	}
	if err := retried(ctx, 100*time.Millisecond, 7*time.Second, always, func() error { return n.register(ctx) }); err != nil {
		return err
	}
	running.Add(1)
	defer running.Add(-1)
	// The kubelet's informers and the kube-proxy's, each as they select.
	pods := n.informer(c.CoreV1().RESTClient(), c, "pods", "", "spec.nodeName", n.name, &corev1.Pod{})
	if _, err := pods.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { n.podSeen(ctx, o) },
		UpdateFunc: func(_, o any) { n.podSeen(ctx, o) },
		DeleteFunc: n.podGone,
	}); err != nil {
		return err
	}
	own := n.informer(c.CoreV1().RESTClient(), c, "nodes", "", "metadata.name", n.name, &corev1.Node{})
	started := []cache.SharedIndexInformer{
		pods,
		own,
		n.informer(c.CoreV1().RESTClient(), c, "services", "", "", "", &corev1.Service{}),
		n.informer(c.NodeV1().RESTClient(), c, "runtimeclasses", "", "", "", &nodev1.RuntimeClass{}),
		n.informer(c.StorageV1().RESTClient(), c, "csidrivers", "", "", "", &storagev1.CSIDriver{}),
		// The kube-proxy's, under its own identity.
		n.informer(p.CoreV1().RESTClient(), p, "services", "", "", "", &corev1.Service{}),
		n.informer(p.DiscoveryV1().RESTClient(), p, "endpointslices", "", "", "", &discoveryv1.EndpointSlice{}),
		n.informer(p.NetworkingV1().RESTClient(), p, "servicecidrs", "", "", "", &networkingv1.ServiceCIDR{}),
		n.informer(p.CoreV1().RESTClient(), p, "nodes", "", "metadata.name", n.name, &corev1.Node{}),
	}
	for _, inf := range started {
		go inf.RunWithContext(ctx)
	}
	// The lease, renewed every 10 s; and the node's status looked at as often, posted when
	// its Node says other than Ready (the node lifecycle controller marks it Unknown when
	// the lease lapsed) or 5 minutes after the last report: the kubelet's
	// nodeStatusUpdateFrequency and nodeStatusReportFrequency.
	renew := time.NewTicker(10 * time.Second)
	defer renew.Stop()
	reported := time.Now()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-renew.C:
			if err := n.renew(ctx); err != nil && ctx.Err() == nil {
				log.Printf("%s: renewing its lease: %v", n.name, err)
			}
			if !n.statusDue(own.GetStore(), reported) {
				continue
			}
			if err := n.postStatus(ctx); err != nil {
				if ctx.Err() == nil {
					log.Printf("%s: posting its status: %v", n.name, err)
				}
				continue
			}
			reported = time.Now()
		}
	}
}

// statusDue: whether the node's status is to be posted now: its Node, as its informer has it,
// is not Ready, or the last report was 5 minutes ago.
func (n *node) statusDue(nodes cache.Store, reported time.Time) bool {
	if time.Since(reported) >= 5*time.Minute {
		return true
	}
	obj, ok, err := nodes.GetByKey(n.name)
	if err != nil || !ok {
		return false
	}
	node, ok := obj.(*corev1.Node)
	if !ok {
		return false
	}
	for _, c := range node.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status != corev1.ConditionTrue
		}
	}
	return true
}

// nodeStatus is what the node reports of itself, Ready, heartbeat at now.
func nodeStatus(now metav1.Time) corev1.NodeStatus {
	pods := resource.MustParse("110")
	return corev1.NodeStatus{
		Capacity:    corev1.ResourceList{corev1.ResourcePods: pods, corev1.ResourceCPU: resource.MustParse("4"), corev1.ResourceMemory: resource.MustParse("16Gi")},
		Allocatable: corev1.ResourceList{corev1.ResourcePods: pods, corev1.ResourceCPU: resource.MustParse("4"), corev1.ResourceMemory: resource.MustParse("16Gi")},
		Conditions: []corev1.NodeCondition{{
			Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady",
			Message: "simulated", LastHeartbeatTime: now, LastTransitionTime: now,
		}},
		NodeInfo: corev1.NodeSystemInfo{KubeletVersion: "v1.37.2", OperatingSystem: "linux", Architecture: "amd64"},
	}
}

// postStatus patches the node's status, as the kubelet patches it (a status subresource the
// create drops; controllers write the Node's taints meanwhile, which a node may not touch).
func (n *node) postStatus(ctx context.Context) error {
	status, err := json.Marshal(map[string]any{"status": nodeStatus(metav1.Now())})
	if err != nil {
		return err
	}
	_, err = n.client.CoreV1().Nodes().Patch(ctx, n.name, types.StrategicMergePatchType, status, metav1.PatchOptions{}, "status")
	return err
}

func (n *node) register(ctx context.Context) error {
	obj := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: n.name, Labels: map[string]string{
			"kubernetes.io/hostname": n.name, "kubernetes.io/os": "linux", "type": "simulated",
		}},
	}
	if _, err := n.client.CoreV1().Nodes().Create(ctx, obj, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	if err := n.postStatus(ctx); err != nil {
		return err
	}
	return n.renew(ctx)
}

func (n *node) renew(ctx context.Context) error {
	leases := n.client.CoordinationV1().Leases("kube-node-lease")
	now := metav1.NewMicroTime(time.Now())
	put := func(l *coordinationv1.Lease) error {
		l.Spec.RenewTime = &now
		updated, err := leases.Update(ctx, l, metav1.UpdateOptions{})
		if err == nil {
			n.lease = updated
		}
		return err
	}
	// As the kubelet's lease controller: the lease it last wrote, updated with no GET first;
	// a GET (and a create where there is none) only when that update fails.
	if n.lease != nil && put(n.lease.DeepCopy()) == nil {
		return nil
	}
	l, err := leases.Get(ctx, n.name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		holder, seconds := n.name, int32(40)
		created, err := leases.Create(ctx, &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: n.name},
			Spec:       coordinationv1.LeaseSpec{HolderIdentity: &holder, LeaseDurationSeconds: &seconds, RenewTime: &now},
		}, metav1.CreateOptions{})
		if err == nil {
			n.lease = created
		}
		return err
	}
	if err != nil {
		return err
	}
	return put(l)
}

// podSeen starts a pod bound to this node: the informers of the ConfigMaps and Secrets it
// mounts first, then its status, Running.
func (n *node) podSeen(ctx context.Context, o any) {
	pod, ok := o.(*corev1.Pod)
	if !ok {
		return
	}
	if pod.DeletionTimestamp != nil {
		// Its containers stopped at once: the kubelet's final delete.
		go func() {
			zero := int64(0)
			err := retried(ctx, time.Second, 10*time.Second, transient, func() error {
				err := n.client.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{
					GracePeriodSeconds: &zero,
					Preconditions:      &metav1.Preconditions{UID: &pod.UID},
				})
				if apierrors.IsConflict(err) {
					return nil // another pod of that name now
				}
				return err
			})
			if err != nil && ctx.Err() == nil && !apierrors.IsNotFound(err) {
				log.Printf("%s: deleting pod %s/%s: %v", n.name, pod.Namespace, pod.Name, err)
			}
		}()
		return
	}
	if pod.Status.Phase != "" && pod.Status.Phase != corev1.PodPending {
		return
	}
	go func() {
		for _, v := range pod.Spec.Volumes {
			switch {
			case v.ConfigMap != nil:
				n.object(ctx, pod.UID, "configmaps", pod.Namespace, v.ConfigMap.Name)
			case v.Secret != nil:
				n.object(ctx, pod.UID, "secrets", pod.Namespace, v.Secret.SecretName)
			case v.Projected != nil:
				// The ServiceAccount token volume: kube-root-ca.crt, and a token requested
				// for the pod.
				for _, src := range v.Projected.Sources {
					switch {
					case src.ConfigMap != nil:
						n.object(ctx, pod.UID, "configmaps", pod.Namespace, src.ConfigMap.Name)
					case src.ServiceAccountToken != nil:
						n.token(ctx, pod, src.ServiceAccountToken)
					}
				}
			}
		}
		now := metav1.Now()
		patch := fmt.Sprintf(`{"status":{"phase":"Running","startTime":%q,"conditions":[`+
			`{"type":"Initialized","status":"True","lastTransitionTime":%[1]q},`+
			`{"type":"Ready","status":"True","lastTransitionTime":%[1]q},`+
			`{"type":"ContainersReady","status":"True","lastTransitionTime":%[1]q},`+
			`{"type":"PodScheduled","status":"True","lastTransitionTime":%[1]q}],`+
			`"podIP":"10.64.0.1","hostIP":"10.0.0.1"}}`, now.UTC().Format(time.RFC3339))
		err := retried(ctx, time.Second, 10*time.Second, transient, func() error {
			_, err := n.client.CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}, "status")
			return err
		})
		if err == nil {
			n.podsRunning.Add(1)
		} else if ctx.Err() == nil && !apierrors.IsNotFound(err) {
			log.Printf("%s: pod %s/%s status: %v", n.name, pod.Namespace, pod.Name, err)
		}
	}()
}

// retried calls do until it succeeds, fails in a way again does not want tried again, or
// ctx ends; first apart at first, then twice as long each time up to most.
func retried(ctx context.Context, first, most time.Duration, again func(error) bool, do func() error) error {
	for backoff := first; ; backoff = min(2*backoff, most) {
		err := do()
		if err == nil || !again(err) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(backoff):
		}
	}
}

// transient: an answer a kubelet's status manager and pod workers try again on their next
// sync, every 10 s: anything but a gone object and a 4xx other than 429.
func transient(err error) bool {
	if apierrors.IsNotFound(err) {
		return false
	}
	if s, ok := err.(apierrors.APIStatus); ok {
		code := s.Status().Code
		return code < 400 || code >= 500 || code == 429
	}
	return true
}

// token requests a pod's projected ServiceAccount token, bound to the pod, as the kubelet
// does before it sets up the volume.
func (n *node) token(ctx context.Context, pod *corev1.Pod, src *corev1.ServiceAccountTokenProjection) {
	seconds := int64(3607)
	if src.ExpirationSeconds != nil {
		seconds = *src.ExpirationSeconds
	}
	var audiences []string
	if src.Audience != "" {
		audiences = []string{src.Audience}
	}
	req := &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{
			Audiences:         audiences,
			ExpirationSeconds: &seconds,
			BoundObjectRef:    &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID},
		},
	}
	// NodeRestriction reads the pod from kube-apiserver's own cache, which may not have its
	// binding yet: the kubelet retries too.
	var err error
	for try := 0; try < 10; try++ {
		_, err = n.client.CoreV1().ServiceAccounts(pod.Namespace).CreateToken(ctx, pod.Spec.ServiceAccountName, req, metav1.CreateOptions{})
		if err == nil || !apierrors.IsForbidden(err) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err != nil && ctx.Err() == nil {
		log.Printf("%s: token for pod %s/%s: %v", n.name, pod.Namespace, pod.Name, err)
	}
}

// mounted is one single-object informer and the pods that mount its object.
type mounted struct {
	synced chan struct{}
	stop   context.CancelFunc
	pods   map[types.UID]bool
	w      *watched
}

// object starts (once) a single-object informer of a ConfigMap or Secret that pod mounts, and
// waits until it has synced, as the kubelet's watch-based managers do before a volume is set
// up.
func (n *node) object(ctx context.Context, pod types.UID, resource, namespace, name string) {
	key := resource + "/" + namespace + "/" + name
	n.mu.Lock()
	if n.objects == nil {
		n.objects, n.mounts = map[string]*mounted{}, map[types.UID][]string{}
	}
	m, ok := n.objects[key]
	if !ok {
		var informerCtx context.Context
		informerCtx, cancel := context.WithCancel(ctx)
		m = &mounted{synced: make(chan struct{}), stop: cancel, pods: map[types.UID]bool{}}
		var obj runtime.Object = &corev1.Secret{}
		if resource == "configmaps" {
			obj = &corev1.ConfigMap{}
		}
		m.w = n.watch(n.client.CoreV1().RESTClient(), n.client, resource, namespace, "metadata.name", name, obj)
		inf := m.w.informer
		n.objects[key] = m
		go inf.RunWithContext(informerCtx)
		go func() {
			cache.WaitForCacheSync(informerCtx.Done(), inf.HasSynced)
			close(m.synced)
		}()
	}
	if !m.pods[pod] {
		m.pods[pod] = true
		n.mounts[pod] = append(n.mounts[pod], key)
	}
	n.mu.Unlock()
	select {
	case <-m.synced:
	case <-ctx.Done():
	}
}

// podGone releases what a pod deleted from the node mounted: an informer no pod needs any
// more stops, as the kubelet's does once the last pod using its object is gone.
func (n *node) podGone(o any) {
	if d, ok := o.(cache.DeletedFinalStateUnknown); ok {
		o = d.Obj
	}
	pod, ok := o.(*corev1.Pod)
	if !ok {
		return
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, key := range n.mounts[pod.UID] {
		m := n.objects[key]
		if m == nil {
			continue
		}
		delete(m.pods, pod.UID)
		if len(m.pods) == 0 {
			m.stop()
			n.stats.remove(m.w)
			delete(n.objects, key)
		}
	}
	delete(n.mounts, pod.UID)
}

// ca signs the nodes' client certificates.
type ca struct {
	cert *x509.Certificate
	key  any
}

func loadCA(certFile, keyFile string) (*ca, error) {
	certPEM, err := os.ReadFile(certFile)
	if err != nil {
		return nil, err
	}
	keyPEM, err := os.ReadFile(keyFile)
	if err != nil {
		return nil, err
	}
	cb, _ := pem.Decode(certPEM)
	kb, _ := pem.Decode(keyPEM)
	if cb == nil || kb == nil {
		return nil, fmt.Errorf("%s, %s: no PEM", certFile, keyFile)
	}
	cert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, err
	}
	key, err := x509.ParsePKCS8PrivateKey(kb.Bytes)
	if err != nil {
		if key, err = x509.ParsePKCS1PrivateKey(kb.Bytes); err != nil {
			return nil, fmt.Errorf("%s: %w", keyFile, err)
		}
	}
	return &ca{cert: cert, key: key}, nil
}

func (c *ca) mint(cn, org string) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	serial, err := rand.Int(rand.Reader, big.NewInt(1<<62))
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: cn},
		NotBefore:    time.Now().Add(-5 * time.Minute),
		NotAfter:     time.Now().Add(48 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	if org != "" {
		tmpl.Subject.Organization = []string{org}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, c.cert, &key.PublicKey, c.key)
	if err != nil {
		return nil, nil, err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), nil
}
