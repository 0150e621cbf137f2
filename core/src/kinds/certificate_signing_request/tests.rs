//! The kind's rules, table by table: create validation, the update paths (object,
//! `/approval`, `/status`), condition timestamps, PEM reading, the Table cells.
// Test code: arithmetic on fixtures is checked by the assertions.
#![allow(clippy::arithmetic_side_effects)]

use base64::Engine as _;
use serde_json::json;

use super::*;
use crate::object::{self, prepare_update_via};
use crate::validation::declarative::Validator;

/// `openssl req -new -subj "/O=dev/O=qa/CN=jane"` with a P-256 key.
const REQUEST: &str = "-----BEGIN CERTIFICATE REQUEST-----
MIHkMIGMAgEAMCoxDDAKBgNVBAoMA2RldjELMAkGA1UECgwCcWExDTALBgNVBAMM
BGphbmUwWTATBgcqhkjOPQIBBggqhkjOPQMBBwNCAARxPpT7Z9wSpnULBIoQsPCM
M73NEv9HAYZRBHKceX0Bf11VwT+OQcTeyuhc/d3lXm1yurVcZZmeAu7WXzQcGMWF
oAAwCgYIKoZIzj0EAwIDRwAwRAIgJ+u68srrxJYQ2xOv2JPEJ0eJwC+/iCSiXUIp
DaAryAUCIEDgpIihH8r7FwbgT9/CUyc1nUEjTcKF6xq8TyQRPs2e
-----END CERTIFICATE REQUEST-----
";

/// A self-signed certificate (`openssl req -x509`), as a signer would write one.
const CERTIFICATE: &str = "-----BEGIN CERTIFICATE-----
MIIBdzCCAR2gAwIBAgIUWsLCtvOtgrzYqo+nBVjkFKxUpSUwCgYIKoZIzj0EAwIw
ETEPMA0GA1UEAwwGaXNzdWVkMB4XDTI2MTEyMzE2MDQ1MVoXDTM2MTEyMDE2MDQ1
MVowETEPMA0GA1UEAwwGaXNzdWVkMFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAE
cT6U+2fcEqZ1CwSKELDwjDO9zRL/RwGGUQRynHl9AX9dVcE/jkHE3sroXP3d5V5t
crq1XGWZngLu1l80HBjFhaNTMFEwHQYDVR0OBBYEFPBsWpfrBAo81tSSJlDXZZ8v
25MLMB8GA1UdIwQYMBaAFPBsWpfrBAo81tSSJlDXZZ8v25MLMA8GA1UdEwEB/wQF
MAMBAf8wCgYIKoZIzj0EAwIDSAAwRQIhAIJlLvMr+9JNrHTpJlnjTYy7HZ5dKk8s
QwVGXog0bBVjAiAR+rg/rbFcu0lVlufONyIj1S2aPUSZNrFTb0gnb8ug3w==
-----END CERTIFICATE-----
";

/// The request with one bit of its signature flipped.
fn tampered_request() -> Vec<u8> {
    let (block, _) = decode_pem(REQUEST.as_bytes()).unwrap();
    let mut der = block.der;
    let last = der.len() - 1;
    der[last] ^= 1;
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    format!("-----BEGIN CERTIFICATE REQUEST-----\n{b64}\n-----END CERTIFICATE REQUEST-----\n")
        .into_bytes()
}

fn valid() -> CertificateSigningRequest {
    let mut csr: CertificateSigningRequest = serde_json::from_value(json!({
        "metadata": {"name": "jane"},
        "spec": {
            "request": base64::engine::general_purpose::STANDARD.encode(REQUEST),
            "signerName": SIGNER_APISERVER_CLIENT,
            "usages": ["digital signature", "key encipherment", "client auth"],
        },
    }))
    .unwrap();
    csr.set_type_meta();
    csr
}

fn condition(ty: &str, status: &str) -> CertificateSigningRequestCondition {
    CertificateSigningRequestCondition {
        type_: ty.into(),
        status: status.into(),
        ..Default::default()
    }
}

/// The fields of the causes a validation produced.
fn fields(errs: &ErrorList) -> Vec<String> {
    errs.0.iter().map(|c| c.field.clone()).collect()
}

#[test]
fn create_validation_names_each_bad_field() {
    type Edit = fn(&mut CertificateSigningRequest);
    let cases: &[(&str, Edit, &[&str])] = &[
        ("valid", |_| {}, &[]),
        (
            "not PEM",
            |c| c.spec.request = b"hello".to_vec(),
            &["spec.request"],
        ),
        (
            "wrong block type",
            |c| c.spec.request = CERTIFICATE.as_bytes().to_vec(),
            &["spec.request"],
        ),
        (
            "bad signature",
            |c| c.spec.request = tampered_request(),
            &["spec.request"],
        ),
        ("no usages", |c| c.spec.usages.clear(), &["spec.usages"]),
        (
            "unknown usage",
            |c| c.spec.usages.push("world domination".into()),
            &["spec.usages[3]"],
        ),
        (
            "repeated usage",
            |c| c.spec.usages.push("client auth".into()),
            &["spec.usages[3]"],
        ),
        (
            "no signer",
            |c| c.spec.signer_name.clear(),
            &["spec.signerName"],
        ),
        (
            "signer without path",
            |c| c.spec.signer_name = "svc.io".into(),
            &["spec.signerName"],
        ),
        (
            "one-label domain",
            |c| c.spec.signer_name = "svc/x".into(),
            &["spec.signerName"],
        ),
        (
            "custom signer",
            |c| c.spec.signer_name = "example.com/my-signer".into(),
            &[],
        ),
        (
            "599 seconds",
            |c| c.spec.expiration_seconds = Some(599),
            &["spec.expirationSeconds"],
        ),
        (
            "600 seconds",
            |c| c.spec.expiration_seconds = Some(600),
            &[],
        ),
        (
            "Approved False",
            |c| c.status.conditions = vec![condition("Approved", "False")],
            &["status.conditions[0].status"],
        ),
        (
            "custom condition False",
            |c| c.status.conditions = vec![condition("Reviewed", "False")],
            &[],
        ),
        (
            "no condition status",
            |c| c.status.conditions = vec![condition("Failed", "")],
            &["status.conditions[0].status"],
        ),
        (
            "no condition type",
            |c| c.status.conditions = vec![condition("", "True")],
            &["status.conditions[0].type"],
        ),
        (
            "Approved and Denied",
            |c| {
                c.status.conditions =
                    vec![condition("Approved", "True"), condition("Denied", "True")]
            },
            &["status.conditions[1].type"],
        ),
        (
            "two Failed",
            |c| {
                c.status.conditions = vec![condition("Failed", "True"), condition("Failed", "True")]
            },
            &["status.conditions[1].type"],
        ),
        (
            "certificate",
            |c| c.status.certificate = format!("issued:\n{CERTIFICATE}trailer").into_bytes(),
            &[],
        ),
        (
            "certificate not PEM",
            |c| c.status.certificate = b"nope".to_vec(),
            &["status.certificate"],
        ),
        (
            "certificate block of another type",
            |c| c.status.certificate = REQUEST.as_bytes().to_vec(),
            &["status.certificate"],
        ),
        (
            "certificate with headers",
            |c| {
                let with = CERTIFICATE.replacen("-----\n", "-----\nProc-Type: 4,ENCRYPTED\n\n", 1);
                c.status.certificate = with.into_bytes();
            },
            &["status.certificate"],
        ),
    ];
    for (name, edit, want) in cases {
        let mut csr = valid();
        edit(&mut csr);
        assert_eq!(fields(&csr.validate()), *want, "{name}");
    }
}

#[test]
fn create_records_the_requester_and_clears_status() {
    let mut csr = valid();
    csr.spec.username = "mallory".into();
    csr.status.conditions = vec![condition("Approved", "True")];
    csr.status.certificate = CERTIFICATE.as_bytes().to_vec();
    let user = UserInfo {
        username: "jane".into(),
        uid: "u-1".into(),
        groups: vec!["dev".into(), "system:authenticated".into()],
        extra: BTreeMap::from([("scopes".into(), vec!["a".into()])]),
    };
    object::prepare_create_by(
        &mut csr,
        &user,
        &crate::ambient::System,
        &Validator::default(),
    )
    .unwrap();
    assert_eq!(csr.spec.username, "jane");
    assert_eq!(csr.spec.uid, "u-1");
    assert_eq!(csr.spec.groups, user.groups);
    assert_eq!(csr.spec.extra, user.extra);
    assert_eq!(csr.status, CertificateSigningRequestStatus::default());
}

/// A stored request (created by jane), pending.
fn stored() -> CertificateSigningRequest {
    let mut csr = valid();
    let user = UserInfo {
        username: "jane".into(),
        groups: vec!["dev".into()],
        ..Default::default()
    };
    object::prepare_create_by(
        &mut csr,
        &user,
        &crate::ambient::System,
        &Validator::default(),
    )
    .unwrap();
    csr.metadata.resource_version = "5".into();
    csr
}

fn approved(mut csr: CertificateSigningRequest) -> CertificateSigningRequest {
    let mut c = condition("Approved", "True");
    c.last_update_time = Some(Time::now());
    c.last_transition_time = c.last_update_time;
    csr.status.conditions.push(c);
    csr
}

/// The fields of the 422 an update through `sub` gets, or empty when it is accepted.
fn update_errors(
    old: &CertificateSigningRequest,
    sub: Option<&str>,
    edit: fn(&mut CertificateSigningRequest),
) -> Vec<String> {
    let mut new = old.clone();
    edit(&mut new);
    match prepare_update_via(
        &mut new,
        old,
        sub,
        &crate::ambient::System,
        &Validator::default(),
    ) {
        Ok(()) => vec![],
        Err(ApiError::Invalid { causes, .. }) => causes.into_iter().map(|c| c.field).collect(),
        Err(e) => panic!("unexpected error {e}"),
    }
}

/// (name, stored object, subresource, edit, fields of the expected 422).
type UpdateCase<'a> = (
    &'a str,
    &'a CertificateSigningRequest,
    Option<&'a str>,
    fn(&mut CertificateSigningRequest),
    &'a [&'a str],
);

#[test]
fn updates_keep_spec_and_condition_rules() {
    let pending = stored();
    let approved = approved(stored());
    let denied = {
        let mut d = stored();
        d.status.conditions.push(condition("Denied", "True"));
        d
    };
    let issued = {
        let mut i = approved.clone();
        i.status.certificate = CERTIFICATE.as_bytes().to_vec();
        i
    };
    let (obj, appr, stat) = (None, Some(SUBRESOURCE_APPROVAL), Some(SUBRESOURCE_STATUS));
    let cases: &[UpdateCase<'_>] = &[
        (
            "labels only",
            &pending,
            obj,
            |c| {
                c.metadata.labels.insert("a".into(), "b".into());
            },
            &[],
        ),
        (
            "signer changed",
            &pending,
            obj,
            |c| c.spec.signer_name = "example.com/x".into(),
            &["spec.signerName"],
        ),
        (
            "usages and expiry changed",
            &pending,
            obj,
            |c| {
                c.spec.usages.pop();
                c.spec.expiration_seconds = Some(3600);
            },
            &["spec.expirationSeconds", "spec.usages"],
        ),
        (
            "requester changed",
            &pending,
            obj,
            |c| c.spec.username = "mallory".into(),
            &["spec.username"],
        ),
        (
            "requester left out",
            &pending,
            obj,
            |c| {
                c.spec.username.clear();
                c.spec.groups.clear();
            },
            &[],
        ),
        (
            "status through the object is ignored",
            &pending,
            obj,
            |c| {
                c.status.conditions.push(condition("Approved", "True"));
            },
            &[],
        ),
        (
            "approve",
            &pending,
            appr,
            |c| c.status.conditions.push(condition("Approved", "True")),
            &[],
        ),
        (
            "spec through approval is ignored",
            &pending,
            appr,
            |c| {
                c.spec.signer_name = "example.com/x".into();
                c.status.conditions.push(condition("Denied", "True"));
            },
            &[],
        ),
        (
            "remove Approved",
            &approved,
            appr,
            |c| c.status.conditions.clear(),
            &["status.conditions"],
        ),
        (
            "approve the denied",
            &denied,
            appr,
            |c| c.status.conditions.push(condition("Approved", "True")),
            &["status.conditions[1].type"],
        ),
        (
            "approve through status",
            &pending,
            stat,
            |c| c.status.conditions.push(condition("Approved", "True")),
            &["status.conditions"],
        ),
        (
            "certificate before approval",
            &pending,
            stat,
            |c| c.status.certificate = CERTIFICATE.as_bytes().to_vec(),
            &["status.certificate"],
        ),
        (
            "certificate through approval is ignored",
            &approved,
            appr,
            |c| c.status.certificate = CERTIFICATE.as_bytes().to_vec(),
            &[],
        ),
        (
            "issue",
            &approved,
            stat,
            |c| c.status.certificate = CERTIFICATE.as_bytes().to_vec(),
            &[],
        ),
        (
            "issue garbage",
            &approved,
            stat,
            |c| c.status.certificate = b"x".to_vec(),
            &["status.certificate"],
        ),
        (
            "re-issue",
            &issued,
            stat,
            |c| c.status.certificate = format!("{CERTIFICATE}{CERTIFICATE}").into_bytes(),
            &["status.certificate"],
        ),
        (
            "fail",
            &approved,
            stat,
            |c| c.status.conditions.push(condition("Failed", "True")),
            &[],
        ),
        (
            "issue after failing",
            &approved,
            stat,
            |c| {
                c.status.conditions.push(condition("Failed", "True"));
                c.status.certificate = CERTIFICATE.as_bytes().to_vec();
            },
            &["status.certificate"],
        ),
        (
            "remove Failed",
            &{
                let mut f = approved.clone();
                f.status.conditions.push(condition("Failed", "True"));
                f
            },
            stat,
            |c| {
                c.status.conditions.retain(|c| c.type_ != "Failed");
            },
            &["status.conditions"],
        ),
    ];
    for (name, old, sub, edit, want) in cases {
        assert_eq!(update_errors(old, *sub, *edit), *want, "{name}");
    }
}

#[test]
fn subresources_keep_what_they_do_not_own() {
    let old = approved(stored());
    // /status cannot rewrite Approved: its stored form is kept.
    let mut new = old.clone();
    new.status.conditions[0].message = "rewritten".into();
    new.status.certificate = CERTIFICATE.as_bytes().to_vec();
    prepare_update_via(
        &mut new,
        &old,
        Some(SUBRESOURCE_STATUS),
        &crate::ambient::System,
        &Validator::default(),
    )
    .unwrap();
    assert_eq!(new.status.conditions[0], old.status.conditions[0]);
    assert_eq!(new.status.certificate, CERTIFICATE.as_bytes());
    // Another subresource is not served.
    let mut other = old.clone();
    let e = prepare_update_via(
        &mut other,
        &old,
        Some("scale"),
        &crate::ambient::System,
        &Validator::default(),
    )
    .unwrap_err();
    assert_eq!(e.code(), 405);
}

#[test]
fn condition_timestamps_are_defaulted() {
    let old = approved(stored());
    let kept = old.status.conditions[0].last_transition_time;
    let mut new = old.clone();
    // Written again without times, as kubectl and controllers do.
    new.status.conditions[0].last_update_time = None;
    new.status.conditions[0].last_transition_time = None;
    new.status.conditions.push(condition("Reviewed", "Unknown"));
    prepare_update_via(
        &mut new,
        &old,
        Some(SUBRESOURCE_APPROVAL),
        &crate::ambient::System,
        &Validator::default(),
    )
    .unwrap();
    let [approved, reviewed] = &new.status.conditions[..] else {
        panic!("{:?}", new.status.conditions)
    };
    assert_eq!(
        approved.last_transition_time, kept,
        "same type and status: kept"
    );
    assert!(approved.last_update_time.is_some());
    assert!(reviewed.last_transition_time.is_some() && reviewed.last_update_time.is_some());
}

#[test]
fn pem_reads_like_go() {
    let text = format!("leading text\n{REQUEST}\nmiddle\n{CERTIFICATE}trailing");
    let (first, rest) = decode_pem(text.as_bytes()).unwrap();
    assert_eq!(first.label, "CERTIFICATE REQUEST");
    assert!(!first.has_headers);
    let (second, rest) = decode_pem(rest).unwrap();
    assert_eq!(second.label, "CERTIFICATE");
    assert_eq!(rest, b"trailing");
    assert!(decode_pem(rest).is_none());
    // A block whose END does not match is passed over; the next one is found.
    let broken = format!("-----BEGIN X-----\nAAAA\n-----END Y-----\n{CERTIFICATE}");
    assert_eq!(
        decode_pem(broken.as_bytes()).unwrap().0.label,
        "CERTIFICATE"
    );
    // Headers are seen; bad base64 is not a block.
    let headed = "-----BEGIN X-----\nProc-Type: 4\n\nAAAA\n-----END X-----\n";
    let (h, _) = decode_pem(headed.as_bytes()).unwrap();
    assert!(h.has_headers);
    assert_eq!(h.der, vec![0, 0, 0]);
    assert!(decode_pem(b"-----BEGIN X-----\n!!!!\n-----END X-----\n").is_none());
    // CRLF line endings and no newline at the very end.
    let crlf = REQUEST.replace('\n', "\r\n");
    assert!(parse_request(crlf.trim_end().as_bytes()).is_ok());
    assert!(parse_request(b"").is_err());
}

#[test]
fn json_carries_bytes_as_base64_and_table_cells_read_like_kubectl() {
    let mut csr = approved(stored());
    csr.spec.expiration_seconds = Some(3600);
    csr.status.certificate = CERTIFICATE.as_bytes().to_vec();
    let v = serde_json::to_value(&csr).unwrap();
    let b64 = base64::engine::general_purpose::STANDARD;
    assert_eq!(v["spec"]["request"], b64.encode(REQUEST));
    assert_eq!(v["status"]["certificate"], b64.encode(CERTIFICATE));
    let back: CertificateSigningRequest = serde_json::from_value(v.clone()).unwrap();
    assert_eq!(back, csr);
    // Line-wrapped base64 is accepted, `null` reads as empty, bad base64 is refused.
    let wrapped = b64.encode(REQUEST).replacen('A', "A\n", 1);
    let w: CertificateSigningRequestSpec =
        serde_json::from_value(json!({"request": wrapped, "signerName": "a.b/c"})).unwrap();
    assert_eq!(w.request, REQUEST.as_bytes());
    let n: CertificateSigningRequestStatus =
        serde_json::from_value(json!({"certificate": null})).unwrap();
    assert!(n.certificate.is_empty());
    assert!(
        serde_json::from_value::<CertificateSigningRequestSpec>(json!({"request": "%%"})).is_err()
    );

    let cells: Vec<Value> = COLUMNS
        .iter()
        .map(|c| (c.cell)(&v, time::OffsetDateTime::now_utc()))
        .collect();
    assert_eq!(
        cells[1..],
        [
            json!(SIGNER_APISERVER_CLIENT),
            json!("jane"),
            json!("60m"),
            json!("Approved,Issued")
        ]
    );
    let pending = serde_json::to_value(stored()).unwrap();
    assert_eq!(
        condition_cell(&pending, time::OffsetDateTime::now_utc()),
        json!("Pending")
    );
    assert_eq!(
        duration_cell(&pending, time::OffsetDateTime::now_utc()),
        json!("<none>")
    );
    let failed = json!({"status": {"conditions": [{"type": "Denied"}, {"type": "Failed"}]}});
    assert_eq!(
        condition_cell(&failed, time::OffsetDateTime::now_utc()),
        json!("Denied,Failed")
    );
    assert_eq!(
        signer_cell(&json!({}), time::OffsetDateTime::now_utc()),
        json!("<none>")
    );
}
