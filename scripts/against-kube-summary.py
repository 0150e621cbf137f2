#!/usr/bin/env python3
"""Summarises a scripts/against-kube.sh run: one table per load with every target, ratios
against kube-apiserver, and the issue's targets with hit/miss. Reads OUT/<load>/results.json
(the compare reports) and OUT/machine.md; prints markdown.

usage: scripts/against-kube-summary.py OUT
       scripts/against-kube-summary.py --brief OUT [OUT2 ...]   # compact tables, one per
           load, a cell per run ("run 1 / run 2") for the loads each OUT holds
"""
import json
import os
import sys

KUBE = "kube-apiserver"
GATEWAYS = ["gateway", "gateway-etcd"]


def load(out, name):
    p = os.path.join(out, name, "results.json")
    if not os.path.exists(p):
        return None
    with open(p) as f:
        d = json.load(f)
    runs = {r["target"].get("name") or r["target"]["kind"]: r for r in d["runs"]}
    return {"runs": runs, "failures": d.get("failures", [])}


def f(v, digits=1):
    if v is None:
        return "–"
    if isinstance(v, float) and abs(v) >= 1000:
        return f"{v:,.0f}"
    return f"{v:,.{digits}f}"


def ratio(a, b):
    if a is None or b is None or b == 0:
        return None
    return a / b


def rx(v):
    return "–" if v is None else (f"{v:.2f}×" if v >= 0.1 else f"{v:.3f}×")


def failures(m, d):
    for fl in d["failures"]:
        m.append(f"\n{fl['target']} failed: `{fl['error'][:300]}`")


def cpu_per_event(r):
    c = r["counts"]
    s, st = c.get("server_cpu_us_per_event"), c.get("store_cpu_us_per_event")
    return s, st, (s + (st or 0.0)) if s is not None else None


def fanout_table(m, name, d):
    p = next(iter(d["runs"].values()))["params"]
    tr = f"h2, {p['h2_connections']} connections" if p.get("h2_connections") else "HTTP/1.1"
    m.append(f"\n### {name}: {p['watchers']:,} watchers ({tr}), {p['media']}, "
             f"{p['rate']:.0f} writes/s offered\n")
    m.append("| target | watchers open | writes/s (of offered) | write p99 ms | events/s delivered "
             "(offered) | watchers complete | missing | reconnects | watch p50 ms | watch p99 ms "
             "| server CPU µs/event | store CPU µs/event | server+store µs/event |")
    m.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for t, r in d["runs"].items():
        c, lat = r["counts"], r["latency_ms"]
        s, st, tot = cpu_per_event(r)
        exp = c.get("offered_events_per_s")
        ach = c.get("write_rate_achieved")
        m.append(f"| {t} | {c['watchers_opened']:,} | {c['writes_per_s']:.1f} "
                 f"({'–' if ach is None else f'{ach * 100:.0f} %'}) | {r['write_latency_ms']['p99']:.1f} "
                 f"| {f(c['events_per_s'], 0)} ({f(exp, 0)}) | {c['watchers_complete']:,} "
                 f"| {c['missing']:,} | {c['reconnects']:,} | {lat['p50']:.1f} | {lat['p99']:.1f} "
                 f"| {f(s, 2)} | {f(st, 3)} | {f(tot, 2)} |")
    k = d["runs"].get(KUBE)
    if k:
        m.append("\nAgainst kube-apiserver (row ÷ kube-apiserver; CPU per event is server+store):\n")
        m.append("| target | CPU µs/event | watch p99 | events/s delivered | writes/s | write p99 |")
        m.append("|---|---:|---:|---:|---:|---:|")
        for t, r in d["runs"].items():
            if t == KUBE:
                continue
            m.append(f"| {t} | {rx(ratio(cpu_per_event(r)[2], cpu_per_event(k)[2]))} "
                     f"| {rx(ratio(r['latency_ms']['p99'], k['latency_ms']['p99']))} "
                     f"| {rx(ratio(r['counts']['events_per_s'], k['counts']['events_per_s']))} "
                     f"| {rx(ratio(r['counts']['writes_per_s'], k['counts']['writes_per_s']))} "
                     f"| {rx(ratio(r['write_latency_ms']['p99'], k['write_latency_ms']['p99']))} |")
    failures(m, d)


def list_table(m, name, d):
    p = next(iter(d["runs"].values()))["params"]
    rv = p.get("resource_version")
    mode = f"resourceVersion={rv}" if rv is not None else "resourceVersion unset"
    if p.get("page_size"):
        mode += f", {p['page_size']} per page"
    m.append(f"\n### {name}: {p['objects']:,} objects, {mode}, {p['media']}, "
             f"{p['clients']} clients\n")
    m.append("| target | lists/s | × kube-apiserver | items/s | MB/s | p50 ms | p99 ms | errors "
             "| inconsistent | server CPU s | store CPU s |")
    m.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    k = d["runs"].get(KUBE)
    for t, r in d["runs"].items():
        x, c = r["extra"], r["counts"]
        rr = ratio(x.get("lists_per_s"), k["extra"].get("lists_per_s")) if k else None
        m.append(f"| {t} | {x.get('lists_per_s', 0):.1f} | {rx(rr)} | {f(x.get('items_per_s'), 0)} "
                 f"| {x.get('wire_bytes_per_s', 0) / 1e6:.1f} | {r['latency_ms']['p50']:.1f} "
                 f"| {r['latency_ms']['p99']:.1f} | {x.get('list_errors', 0)} "
                 f"| {x.get('inconsistent_lists', 0)} | {f(c.get('server_cpu_s'), 1)} "
                 f"| {f(c.get('store_cpu_s'), 2)} |")
    failures(m, d)


def hold_steps(r):
    return r["extra"].get("steps") or []


def idle_per_watch(r, s):
    """Bytes per watch at step `s` from the server's RSS with only the connections open:
    (RSS after the step settled, before its writes − RSS with the connections) ÷ watches."""
    x = r["extra"]
    base, per_conn = x.get("server_rss_base_bytes"), x.get("server_bytes_per_connection")
    conns = (r["params"].get("h2_connections") or 0) if per_conn is not None else 0
    if base is None or s.get("server_rss_bytes") is None or not s.get("open"):
        return None
    return (s["server_rss_bytes"] - base - (per_conn or 0) * conns) / s["open"]


def hold_table(m, name, d):
    m.append(f"\n### {name}: idle watches held open (h2), memory per watch\n")
    m.append("| target | watches open | server RSS MiB | bytes/watch (all watches, idle) "
             "| bytes/watch (this step, ΔRSS ÷ Δwatches) "
             "| bytes/watch after 3 writes | watches that got every write | open s |")
    m.append("|---|---:|---:|---:|---:|---:|---:|---:|")
    for t, r in d["runs"].items():
        x = r["extra"]
        m.append(f"| {t} | 0 ({r['params'].get('h2_connections')} connections) "
                 f"| {f((x.get('server_rss_base_bytes') or 0) / 2**20, 0)} (before connections) "
                 f"| {f(x.get('server_bytes_per_connection'), 0)} per connection | | | | |")
        for s in hold_steps(r):
            m.append(f"| {t} | {s['open']:,} | {f((s.get('server_rss_bytes') or 0) / 2**20, 0)} "
                     f"| {f(idle_per_watch(r, s), 0)} | {f(s.get('server_bytes_per_watch'), 0)} "
                     f"| {f(s.get('server_bytes_per_watch_after_writes'), 0)} "
                     f"| {s['check']['complete']:,} | {s['open_s']:.1f} |")
        if r["extra"].get("stopped"):
            m.append(f"| {t} | stopped: {r['extra']['stopped']} | | | | | | |")
    k = d["runs"].get(KUBE)
    if k and hold_steps(k):
        m.append("\nAgainst kube-apiserver (idle bytes per watch, all watches, row ÷ "
                 "kube-apiserver, step by step):\n")
        m.append("| target | " + " | ".join(f"{s['target']:,} watches" for s in hold_steps(k)) + " |")
        m.append("|---|" + "---:|" * len(hold_steps(k)))
        for t, r in d["runs"].items():
            if t == KUBE:
                continue
            cells = [rx(ratio(idle_per_watch(r, a), idle_per_watch(k, b)))
                     for a, b in zip(hold_steps(r), hold_steps(k))]
            m.append(f"| {t} | " + " | ".join(cells) + " |")
    failures(m, d)


def relist_table(m, name, d):
    p = next(iter(d["runs"].values()))["params"]
    m.append(f"\n### {name}: {p['watchers']:,} informers, {p['objects']:,} objects\n")
    m.append("| target | all watching again s | × kube-apiserver | relist+rewatch p50 ms | p99 ms "
             "| relists in storm | errors 429/5xx/other | watchers complete | missing | dups |")
    m.append("|---|---:|---:|---:|---:|---:|---|---:|---:|---:|")
    k = d["runs"].get(KUBE)
    for t, r in d["runs"].items():
        x, c = r["extra"], r["counts"]
        a = x.get("all_watching_again_ms")
        rr = ratio(a, k["extra"].get("all_watching_again_ms")) if k else None
        back = "" if x.get("storm_all_back", True) else " (not all back)"
        m.append(f"| {t} | {(a or 0) / 1000:.2f}{back} | {rx(rr)} | {r['latency_ms']['p50']:.0f} "
                 f"| {r['latency_ms']['p99']:.0f} | {x.get('relists_in_storm', 0):,} "
                 f"| {x.get('relist_errors_429', 0)}/{x.get('relist_errors_5xx', 0)}/"
                 f"{x.get('relist_errors_other', 0)} | {c['watchers_complete']:,}/{c['watchers']:,} "
                 f"| {c['missing']:,} | {c['duplicates']:,} |")
    failures(m, d)


def verdict(ok):
    return "–" if ok is None else ("**hit**" if ok else "**miss**")


def targets(m, loads):
    m.append("\n## The issue's targets\n")
    m.append("| target | goal | load | kube-apiserver | gateway | gateway ÷ kube | verdict "
             "| gateway-etcd | gateway-etcd ÷ kube | verdict |")
    m.append("|---|---|---|---:|---:|---:|---|---:|---:|---|")

    def row(goal_name, goal, load, get, test, fmt):
        d = loads.get(load)
        if not d or KUBE not in d["runs"]:
            m.append(f"| {goal_name} | {goal} | {load} | (no run) | | | | | | |")
            return
        kv = get(d["runs"][KUBE])
        cells = []
        for g in GATEWAYS:
            r = d["runs"].get(g)
            gv = get(r) if r else None
            rr = ratio(gv, kv)
            cells += [fmt(gv), rx(rr), verdict(None if gv is None or kv is None else test(gv, kv, r))]
        m.append(f"| {goal_name} | {goal} | {load} | {fmt(kv)} | " + " | ".join(cells) + " |")

    us = lambda v: "–" if v is None else f"{v:.2f} µs"
    ms = lambda v: "–" if v is None else f"{v:.1f} ms"
    # The load is 10k watchers; the 1k rows follow (a load kube-apiserver keeps up
    # with on this machine, where its p99 is that of every event, not of the few delivered).
    fanouts = [f"fanout-{n}-{t}-{e}" for n in ["10k", "1k"] for t in ["h2", "h1"]
               for e in ["protobuf", "json"]]
    for load in fanouts:
        row("server CPU per delivered watch event (server+store)", "≤ 1/5", load,
            lambda r: cpu_per_event(r)[2], lambda g, k, r: g <= k / 5, us)
    for load in fanouts:
        row("watch event p99", "≤ 1/5", load, lambda r: r["latency_ms"]["p99"],
            lambda g, k, r: g <= k / 5, ms)

    def hold_last(r):
        s = hold_steps(r)
        return idle_per_watch(r, s[-1]) if s else None

    row("memory per idle watch, at the last step (100k)", "≤ 1/10", "hold-100k", hold_last,
        lambda g, k, r: g <= k / 10, lambda v: "–" if v is None else f"{v:,.0f} B")
    for load in ["list-10k-rv0-protobuf", "list-10k-rvunset-protobuf", "list-10k-rv0-json",
                 "list-10k-rvunset-json"]:
        row("lists of 10,000 objects per second", "≥ 3×", load,
            lambda r: r["extra"].get("lists_per_s"), lambda g, k, r: g >= 3 * k,
            lambda v: "–" if v is None else f"{v:.2f}/s")
    row("relist storm, time until all are synced", "≤ 1/5", "relist-storm-2k",
        lambda r: r["extra"].get("all_watching_again_ms"), lambda g, k, r: g <= k / 5, ms)
    for load in ["fanout-10k-h2-protobuf", "fanout-10k-h2-json", "fanout-10k-h1-protobuf",
                 "fanout-10k-h1-json"]:
        row("writes/s achieved beside 10k watchers", "≥ kube-apiserver's and ≥ 98 % of offered",
            load, lambda r: r["counts"]["writes_per_s"],
            lambda g, k, r: g >= k and (r["counts"].get("write_rate_achieved") or 0) >= 0.98,
            lambda v: "–" if v is None else f"{v:.1f}/s")


def brief(outs):
    """Compact per-load tables over several runs: each cell is "run 1 / run 2 / ..."."""
    m = []
    names = sorted({d for o in outs for d in os.listdir(o)
                    if os.path.exists(os.path.join(o, d, "results.json"))},
                   key=lambda n: (["fanout", "list", "hold", "relist"].index(n.split("-")[0]),
                                  "10k" in n, n))
    for name in names:
        ds = [d for d in (load(o, name) for o in outs) if d and d["runs"]]
        if not ds:
            continue
        targets_ = list(ds[0]["runs"].keys())

        def cells(get, fmt):
            out = []
            for t in targets_:
                vals = []
                for d in ds:
                    r = d["runs"].get(t)
                    v = get(r, d) if r else None
                    vals.append(fmt(v))
                out.append(" / ".join(vals))
            return out

        def kratio(get):
            def g(r, d):
                k = d["runs"].get(KUBE)
                return ratio(get(r), get(k)) if k else None
            return g

        p = next(iter(ds[0]["runs"].values()))["params"]
        if name.startswith("fanout"):
            tr = f"h2 ({p['h2_connections']} connections)" if p.get("h2_connections") else "HTTP/1.1"
            m.append(f"\n**{name}**: {p['watchers']:,} watchers over {tr}, {p['media']}, "
                     f"{p['rate']:.0f} writes/s offered ({p['rate'] * p['watchers']:,.0f} events/s)\n")
            cols = [
                ("events/s delivered", cells(lambda r, d: r["counts"]["events_per_s"],
                                             lambda v: f(v, 0))),
                ("watch p99 ms", cells(lambda r, d: r["latency_ms"]["p99"], lambda v: f(v, 0))),
                ("× kube", cells(kratio(lambda r: r["latency_ms"]["p99"]), rx)),
                ("CPU µs/event (store)", cells(
                    lambda r, d: cpu_per_event(r),
                    lambda v: "–" if v is None or v[2] is None else
                    (f"{v[2]:.2f} ({v[1]:.2f})" if v[1] is not None else f"{v[2]:.2f}"))),
                ("× kube", cells(kratio(lambda r: cpu_per_event(r)[2]), rx)),
                ("writes/s", cells(lambda r, d: r["counts"]["writes_per_s"], lambda v: f(v, 1))),
                ("write p99 ms", cells(lambda r, d: r["write_latency_ms"]["p99"],
                                       lambda v: f(v, 0))),
                ("complete watchers", cells(lambda r, d: r["counts"]["watchers_complete"],
                                            lambda v: f"{v:,}")),
                ("reconnects", cells(lambda r, d: r["counts"]["reconnects"], lambda v: f"{v:,}")),
            ]
        elif name.startswith("list"):
            rv = p.get("resource_version")
            mode = f"resourceVersion={rv}" if rv is not None else "resourceVersion unset"
            if p.get("page_size"):
                mode += f", {p['page_size']} per page"
            m.append(f"\n**{name}**: {p['objects']:,} objects, {mode}, {p['media']}, "
                     f"{p['clients']} clients\n")
            cols = [
                ("lists/s", cells(lambda r, d: r["extra"].get("lists_per_s"), lambda v: f(v, 1))),
                ("× kube", cells(kratio(lambda r: r["extra"].get("lists_per_s")), rx)),
                ("p50 ms", cells(lambda r, d: r["latency_ms"]["p50"], lambda v: f(v, 1))),
                ("p99 ms", cells(lambda r, d: r["latency_ms"]["p99"], lambda v: f(v, 1))),
                ("MB/s", cells(lambda r, d: r["extra"].get("wire_bytes_per_s", 0) / 1e6,
                               lambda v: f(v, 0))),
                ("store CPU s", cells(lambda r, d: r["counts"].get("store_cpu_s"),
                                      lambda v: f(v, 2))),
                ("errors", cells(lambda r, d: r["extra"].get("list_errors"), lambda v: f"{v}")),
            ]
        elif name.startswith("hold"):
            m.append(f"\n**{name}**: idle watches as h2 streams over "
                     f"{p.get('h2_connections')} connections\n")

            def step(i):
                return lambda r, d: (idle_per_watch(r, hold_steps(r)[i])
                                     if len(hold_steps(r)) > i else None)
            last = len(hold_steps(next(iter(ds[0]["runs"].values())))) - 1
            cols = [
                ("RSS before connections MiB", cells(
                    lambda r, d: (r["extra"].get("server_rss_base_bytes") or 0) / 2**20,
                    lambda v: f(v, 0))),
                ("per connection B", cells(lambda r, d: r["extra"].get("server_bytes_per_connection"),
                                           lambda v: f(v, 0))),
            ]
            for i, s in enumerate(hold_steps(next(iter(ds[0]["runs"].values())))):
                cols.append((f"RSS at {s['target']:,} MiB", cells(
                    lambda r, d, i=i: (hold_steps(r)[i].get("server_rss_bytes") or 0) / 2**20
                    if len(hold_steps(r)) > i else None, lambda v: f(v, 0))))
                cols.append((f"B/watch at {s['target']:,}", cells(step(i), lambda v: f(v, 0))))
            cols.append(("× kube", cells(
                lambda r, d: ratio(step(last)(r, d), step(last)(d["runs"][KUBE], d))
                if KUBE in d["runs"] else None, rx)))
            cols.append(("watches that got every write", cells(
                lambda r, d: hold_steps(r)[-1]["check"]["complete"] if hold_steps(r) else None,
                lambda v: f"{v:,}" if v is not None else "–")))
        else:
            m.append(f"\n**{name}**: {p['watchers']:,} informers, {p['objects']:,} objects\n")
            cols = [
                ("all watching again s", cells(
                    lambda r, d: (r["extra"].get("all_watching_again_ms") or 0) / 1000,
                    lambda v: f(v, 2))),
                ("× kube", cells(kratio(lambda r: r["extra"].get("all_watching_again_ms")), rx)),
                ("relist+rewatch p50 ms", cells(lambda r, d: r["latency_ms"]["p50"],
                                                lambda v: f(v, 0))),
                ("relist errors", cells(
                    lambda r, d: sum(r["extra"].get(k, 0) for k in
                                     ["relist_errors_429", "relist_errors_5xx",
                                      "relist_errors_other"]), lambda v: f"{v}")),
                ("complete watchers", cells(lambda r, d: r["counts"]["watchers_complete"],
                                            lambda v: f"{v:,}")),
                ("server peak CPU %", cells(
                    lambda r, d: max((x.get("server_cpu_pct") or 0) for x in r["series"]),
                    lambda v: f(v, 0))),
                ("load generator peak CPU %", cells(
                    lambda r, d: max((x.get("client_cpu_pct") or 0) for x in r["series"]),
                    lambda v: f(v, 0))),
            ]
        m.append("| target | " + " | ".join(c for c, _ in cols) + " |")
        m.append("|---|" + "---:|" * len(cols))
        for i, t in enumerate(targets_):
            m.append(f"| {t} | " + " | ".join(v[i] for _, v in cols) + " |")
    print("\n".join(m))


def main():
    if sys.argv[1] == "--brief":
        brief(sys.argv[2:])
        return
    out = sys.argv[1]
    m = []
    mp = os.path.join(out, "machine.md")
    if os.path.exists(mp):
        with open(mp) as fh:
            m.append("```\n" + fh.read().strip() + "\n```")
    loads = {}
    order = sorted(d for d in os.listdir(out) if os.path.exists(os.path.join(out, d, "results.json")))
    key = lambda n: (["fanout", "list", "hold", "relist"].index(n.split("-")[0]) if n.split("-")[0]
                     in ["fanout", "list", "hold", "relist"] else 9, "10k" in n, n)
    for name in sorted(order, key=key):
        d = load(out, name)
        if not d or not d["runs"]:
            m.append(f"\n### {name}: no run succeeded")
            if d:
                failures(m, d)
            continue
        loads[name] = d
        if name.startswith("fanout"):
            fanout_table(m, name, d)
        elif name.startswith("list"):
            list_table(m, name, d)
        elif name.startswith("hold"):
            hold_table(m, name, d)
        elif name.startswith("relist"):
            relist_table(m, name, d)
    targets(m, loads)
    tp = os.path.join(out, "timings.md")
    if os.path.exists(tp):
        with open(tp) as fh:
            m.append("\n## Wall time per load\n\n| load | took | |\n|---|---:|---|\n" + fh.read())
    print("\n".join(m))


if __name__ == "__main__":
    main()
