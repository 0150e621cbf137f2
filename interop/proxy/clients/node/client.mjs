// Drives the svc gateway's proxy mode with the official Kubernetes JavaScript client
// (@kubernetes/client-node, pinned in package.json).
//
//   node client.mjs KUBECONFIG NAMESPACE
//
// The kubeconfig names the proxy; the namespace exists (with its default ServiceAccount).
// Creates two ConfigMaps and a Pod, lists the ConfigMaps with resourceVersion=0 (the proxy's
// cache) and the Pod with field selectors, watches the ConfigMaps from the list's
// resourceVersion while the changes (a create, an update, a delete) are made concurrently, and
// runs the client's informer (makeInformer) to see a ConfigMap created after it started.
// Prints one line per check; exits non-zero on any failure.
import { CoreV1Api, KubeConfig, Watch, makeInformer } from '@kubernetes/client-node';

const POD_IMAGE = 'registry.k8s.io/pause:3.10';
const [kubeconfig, ns] = process.argv.slice(2);
if (!kubeconfig || !ns) {
  console.error('usage: node client.mjs KUBECONFIG NAMESPACE');
  process.exit(2);
}

const kc = new KubeConfig();
kc.loadFromFile(kubeconfig);
const v1 = kc.makeApiClient(CoreV1Api);
const configmapsPath = `/api/v1/namespaces/${ns}/configmaps`;

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
const names = (items) => items.map((o) => o.metadata.name);
function check(ok, what) {
  if (!ok) {
    throw new Error(what);
  }
}
const configmap = (name, data) => ({ metadata: { name, labels: { from: 'node' } }, data });

// Calls f until it returns a truthy value, for at most `seconds`: a read with
// resourceVersion=0 may come from a cache a little behind the writes before it.
async function until(what, seconds, f) {
  const deadline = Date.now() + seconds * 1000;
  for (let tries = 1; ; tries++) {
    const got = await f();
    if (got) {
      return [got, tries];
    }
    if (Date.now() > deadline) {
      throw new Error(`${what}: not so after ${seconds} s (${tries} tries)`);
    }
    await sleep(200);
  }
}

// A watch of the namespace's ConfigMaps from resourceVersion: resolves with the events seen
// (type and name) once stopWhen says so, rejects on an error or after 20 s.
function watchConfigMaps(resourceVersion, stopWhen) {
  return new Promise((resolve, reject) => {
    const seen = [];
    let controller;
    let settled = false;
    const settle = (err) => {
      if (settled) {
        return;
      }
      settled = true;
      clearTimeout(timer);
      if (controller) {
        controller.abort();
      }
      if (err) {
        reject(err);
      } else {
        resolve(seen);
      }
    };
    const timer = setTimeout(
      () => settle(new Error(`the watch from ${resourceVersion}: no end within 20 s, saw ${JSON.stringify(seen)}`)),
      20000,
    );
    new Watch(kc)
      .watch(
        configmapsPath,
        { resourceVersion },
        (type, obj) => {
          if (type === 'ERROR') {
            settle(new Error(`the watch from ${resourceVersion}: ERROR ${JSON.stringify(obj)}`));
            return;
          }
          seen.push([type, obj.metadata.name]);
          if (stopWhen(seen)) {
            settle(null);
          }
        },
        (err) => settle(err || new Error(`the watch from ${resourceVersion} ended, saw ${JSON.stringify(seen)}`)),
      )
      .then((c) => {
        controller = c;
        if (settled) {
          c.abort();
        }
      }, settle);
  });
}

async function main() {
  const one = await v1.createNamespacedConfigMap({ namespace: ns, body: configmap('one', { k: '1' }) });
  const two = await v1.createNamespacedConfigMap({ namespace: ns, body: configmap('two', { k: '2' }) });
  const pod = await v1.createNamespacedPod({
    namespace: ns,
    body: { metadata: { name: 'p' }, spec: { containers: [{ name: 'c', image: POD_IMAGE }] } },
  });
  check(!pod.spec.nodeName, `the new pod has nodeName ${pod.spec.nodeName}`);
  console.log('create ok', one.metadata.resourceVersion, two.metadata.resourceVersion, pod.metadata.resourceVersion);

  // A list with resourceVersion=0: the proxy serves it from its cache.
  const [listed, listTries] = await until('the list resourceVersion=0 has one and two', 15, async () => {
    const list = await v1.listNamespacedConfigMap({ namespace: ns, resourceVersion: '0' });
    return JSON.stringify(names(list.items).sort()) === '["one","two"]' ? list : null;
  });
  const start = listed.metadata.resourceVersion;
  check(
    start && BigInt(start) >= BigInt(two.metadata.resourceVersion),
    `the list's resourceVersion ${start} is older than two's ${two.metadata.resourceVersion}`,
  );
  console.log('list configmaps resourceVersion=0 ok', names(listed.items), 'resourceVersion', start, 'tries', listTries);

  // Field selectors on pods: the unscheduled one by name, from the cache and passed through.
  const fieldSelector = 'spec.nodeName=,metadata.name=p';
  const [pods, podTries] = await until(`the pod list ${fieldSelector} resourceVersion=0`, 15, async () => {
    const list = await v1.listNamespacedPod({ namespace: ns, fieldSelector, resourceVersion: '0' });
    return list.items.length ? list.items : null;
  });
  check(JSON.stringify(names(pods)) === '["p"]', `the pod list ${fieldSelector}: ${names(pods)}`);
  const direct = await v1.listNamespacedPod({ namespace: ns, fieldSelector });
  check(JSON.stringify(names(direct.items)) === '["p"]', `the pod list ${fieldSelector} (no resourceVersion): ${names(direct.items)}`);
  const none = await v1.listNamespacedPod({
    namespace: ns,
    fieldSelector: 'spec.nodeName=nowhere,metadata.name=p',
    resourceVersion: '0',
  });
  check(none.items.length === 0, `the pod list spec.nodeName=nowhere: ${names(none.items)}`);
  console.log('list pods fieldSelector ok', fieldSelector, names(pods), 'tries', podTries);

  // A watch from the list's resourceVersion while a concurrent task makes three changes.
  const watched = watchConfigMaps(start, (seen) => seen.some(([t, n]) => t === 'DELETED' && n === 'two'));
  const changes = (async () => {
    await sleep(500);
    await v1.createNamespacedConfigMap({ namespace: ns, body: configmap('three', { k: '3' }) });
    const got = await v1.readNamespacedConfigMap({ name: 'one', namespace: ns });
    got.data = { k: '1b' };
    await v1.replaceNamespacedConfigMap({ name: 'one', namespace: ns, body: got });
    await v1.deleteNamespacedConfigMap({ name: 'two', namespace: ns });
  })();
  const [seen] = await Promise.all([watched, changes]);
  const want = [
    ['ADDED', 'three'],
    ['MODIFIED', 'one'],
    ['DELETED', 'two'],
  ];
  check(JSON.stringify(seen) === JSON.stringify(want), `the watch from ${start}: ${JSON.stringify(seen)}`);
  console.log('watch from', start, 'ok', JSON.stringify(seen));

  await informerCheck();
}

// The client's informer through the proxy: its list function lists with resourceVersion=0 (as
// client-go's reflector does), its watch starts from that list's version; a ConfigMap created
// after it started reaches its handler and its cache.
async function informerCheck() {
  const informer = makeInformer(kc, configmapsPath, () =>
    v1.listNamespacedConfigMap({ namespace: ns, resourceVersion: '0' }),
  );
  const seen = [];
  const errors = [];
  let sawFour;
  const four = new Promise((resolve) => {
    sawFour = resolve;
  });
  informer.on('add', (obj) => {
    seen.push(['add', obj.metadata.name]);
    if (obj.metadata.name === 'four') {
      sawFour();
    }
  });
  informer.on('update', (obj) => seen.push(['update', obj.metadata.name]));
  informer.on('delete', (obj) => seen.push(['delete', obj.metadata.name]));
  informer.on('error', (err) => errors.push(String(err && (err.stack || err))));
  try {
    await informer.start();
    check(errors.length === 0, `the informer's start: ${errors}`);
    check(
      JSON.stringify(seen.map(([, n]) => n).sort()) === '["one","three"]',
      `the informer's first list: ${JSON.stringify(seen)}`,
    );
    await v1.createNamespacedConfigMap({ namespace: ns, body: configmap('four', { k: '4' }) });
    let timer;
    await Promise.race([
      four,
      new Promise((_, reject) => {
        timer = setTimeout(
          () => reject(new Error(`the informer: no add of four within 20 s (seen ${JSON.stringify(seen)}, errors ${errors})`)),
          20000,
        );
      }),
    ]);
    clearTimeout(timer);
    const cached = names(informer.list(ns)).sort();
    check(JSON.stringify(cached) === '["four","one","three"]', `the informer's cache: ${cached}`);
    check(errors.length === 0, `the informer's errors: ${errors}`);
    console.log('informer ok', JSON.stringify(seen), 'cache', cached);
  } finally {
    await informer.stop();
  }
}

main().then(
  () => process.exit(0),
  (err) => {
    console.log('FAIL', err && err.body ? `${err.message} ${JSON.stringify(err.body)}` : err && (err.stack || err));
    process.exit(1);
  },
);
