//! Tests of audit: events per stage, source IPs, user agents and annotations.

use std::net::IpAddr;

use http::HeaderMap;

use super::request::{MAX_ANNOTATIONS, source_ips, user_agent};
use super::*;

#[test]
fn source_ips_follow_kubernetes() {
    let mut h = HeaderMap::new();
    let peer: IpAddr = "10.0.0.9".parse().unwrap();
    assert_eq!(source_ips(&h, Some(peer)), ["10.0.0.9"]);
    h.insert(
        "x-forwarded-for",
        "1.2.3.4, bogus, 10.0.0.9".parse().unwrap(),
    );
    assert_eq!(source_ips(&h, Some(peer)), ["1.2.3.4", "10.0.0.9"]);
    h.insert("x-forwarded-for", "1.2.3.4".parse().unwrap());
    h.insert("x-real-ip", "5.6.7.8".parse().unwrap());
    assert_eq!(
        source_ips(&h, Some(peer)),
        ["1.2.3.4", "5.6.7.8", "10.0.0.9"]
    );
    h.insert("x-real-ip", "1.2.3.4".parse().unwrap());
    assert_eq!(source_ips(&h, None), ["1.2.3.4"]);
}

#[test]
fn long_user_agents_are_cut() {
    let mut h = HeaderMap::new();
    h.insert(http::header::USER_AGENT, "a".repeat(2000).parse().unwrap());
    let ua = user_agent(&h);
    assert_eq!(ua.len(), 1024 + "...TRUNCATED".len());
    assert!(ua.ends_with("...TRUNCATED"));
}

#[test]
fn the_first_annotation_value_stays_and_the_count_is_bounded() {
    let a = Annotations::default();
    a.add("k", "1");
    a.add("k", "2");
    for i in 0..100 {
        a.add(&format!("n{i}"), "v");
    }
    let map = a.snapshot();
    assert_eq!(map["k"], "1");
    assert_eq!(map.len(), MAX_ANNOTATIONS);
    let mut ext = http::Extensions::new();
    annotate(&ext, "x", "y"); // not audited: nothing happens
    ext.insert(a.clone());
    annotate(&ext, "n0", "other");
    assert_eq!(a.snapshot()["n0"], "v");
}
