//! Authorization per operation through real TLS sockets, with an authorizer that grants one
//! user a fixed set of verbs (standing in for configured authorizers): dry runs need the real
//! verb, server-side apply that creates needs `create` besides `patch`, force deletion needs
//! `unsafe-delete-ignore-read-errors` besides `delete`, subresources are authorized as
//! `<resource>/<sub>`, and denials are 403 in Kubernetes' words.

use http::{Method, StatusCode};
use serde_json::json;
use svc_core::user::UserInfo;
use svc_gateway::base::features::Feature;
use svc_gateway::security::authz::{Attributes, Authorizer, Decision, DecisionFuture};

use crate::support::client::{TestServer, create_namespace};

/// Allows `user` the listed `resource:verb` pairs (`serviceaccounts:patch`), nothing else.
struct Grants {
    user: &'static str,
    allowed: &'static [&'static str],
}

impl Authorizer for Grants {
    fn name(&self) -> &str {
        "grants"
    }
    fn authorize<'a>(
        &'a self,
        user: &'a UserInfo,
        attrs: &'a Attributes<'a>,
    ) -> DecisionFuture<'a> {
        let d = match &attrs.resource {
            Some(r) if user.username == self.user => {
                let resource = match r.subresource {
                    Some(s) => format!("{}/{s}", r.resource),
                    None => r.resource.to_string(),
                };
                if self
                    .allowed
                    .contains(&format!("{resource}:{}", attrs.verb).as_str())
                {
                    Decision::Allow
                } else {
                    Decision::NoOpinion(String::new())
                }
            }
            _ => Decision::NoOpinion(String::new()),
        };
        Box::pin(std::future::ready(d))
    }
}

const APPLY: &str = "application/apply-patch+yaml";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_operation_needs_its_own_verbs() {
    let srv = TestServer::start_with(|o| {
        o.feature_gates
            .set(Feature::AllowUnsafeMalformedObjectDeletion, true);
    })
    .await;
    let admin = srv.admin();
    create_namespace(&admin, "az").await;
    let jane = srv.user("jane", &[]);
    let sa = "/api/v1/namespaces/az/serviceaccounts";

    // Only patch: apply to an existing object works, apply that would create is refused.
    srv.own().security.set_authorizers(vec![Box::new(Grants {
        user: "jane",
        allowed: &["serviceaccounts:patch", "serviceaccounts:get"],
    })]);
    let apply = |name: &str| {
        format!(
            "apiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: {name}\n  labels: {{a: b}}\n"
        )
    };
    let (s, _) = admin
        .post(sa, json!({"metadata": {"name": "exists"}}))
        .await;
    assert_eq!(s, StatusCode::CREATED);
    let r = jane
        .request(
            Method::PATCH,
            &format!("{sa}/exists?fieldManager=jane"),
            &apply("exists"),
            &[("content-type", APPLY)],
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let r = jane
        .request(
            Method::PATCH,
            &format!("{sa}/fresh?fieldManager=jane"),
            &apply("fresh"),
            &[("content-type", APPLY)],
        )
        .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "{}", r.text());
    assert_eq!(
        r.json()["message"],
        "serviceaccounts \"fresh\" is forbidden: User \"jane\" cannot create resource \
         \"serviceaccounts\" in API group \"\" in the namespace \"az\""
    );
    // With create too, the same apply creates.
    srv.own().security.set_authorizers(vec![Box::new(Grants {
        user: "jane",
        allowed: &["serviceaccounts:patch", "serviceaccounts:create"],
    })]);
    let r = jane
        .request(
            Method::PATCH,
            &format!("{sa}/fresh?fieldManager=jane"),
            &apply("fresh"),
            &[("content-type", APPLY)],
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text());

    // A dry run needs exactly the real verb: without delete, a dry-run delete is refused.
    let (s, _) = jane.delete(&format!("{sa}/fresh?dryRun=All")).await;
    assert_eq!(s, StatusCode::FORBIDDEN);

    // Force deletion needs delete and unsafe-delete-ignore-read-errors.
    let force = format!("{sa}/fresh?ignoreStoreReadErrorWithClusterBreakingPotential=true");
    srv.own().security.set_authorizers(vec![Box::new(Grants {
        user: "jane",
        allowed: &["serviceaccounts:delete"],
    })]);
    let (s, st) = jane.delete(&force).await;
    assert_eq!(s, StatusCode::FORBIDDEN, "{st}");
    assert!(
        st["message"]
            .as_str()
            .unwrap()
            .contains("cannot unsafe-delete-ignore-read-errors resource \"serviceaccounts\""),
        "{st}"
    );
    srv.own().security.set_authorizers(vec![Box::new(Grants {
        user: "jane",
        allowed: &[
            "serviceaccounts:delete",
            "serviceaccounts:unsafe-delete-ignore-read-errors",
        ],
    })]);
    let (s, st) = jane.delete(&force).await;
    assert_eq!(s, StatusCode::OK, "{st}");

    // A subresource is its own resource: creating a token needs serviceaccounts/token.
    let token = "/api/v1/namespaces/az/serviceaccounts/default/token";
    let body =
        json!({"apiVersion": "authentication.svc.io/v1", "kind": "TokenRequest", "spec": {}});
    let (s, st) = jane.post(token, body.clone()).await;
    assert_eq!(s, StatusCode::FORBIDDEN, "{st}");
    assert!(
        st["message"]
            .as_str()
            .unwrap()
            .contains("cannot create resource \"serviceaccounts/token\""),
        "{st}"
    );
    srv.own().security.set_authorizers(vec![Box::new(Grants {
        user: "jane",
        allowed: &["serviceaccounts/token:create"],
    })]);
    let (s, st) = jane.post(token, body).await;
    assert_eq!(s, StatusCode::CREATED, "{st}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_past_the_inflight_limits_get_429_with_retry_after() {
    let srv = TestServer::start_with(|o| {
        o.max_requests_inflight = 1;
        o.max_mutating_requests_inflight = 1;
        // No queueing: a full limit answers 429 at once (`fairness.rs` tests the queues).
        o.max_queued_requests_per_user = 0;
    })
    .await;
    let admin = srv.admin();
    create_namespace(&admin, "busy").await;
    srv.own().security.set_authorizers(vec![Box::new(Grants {
        user: "bob",
        allowed: &["serviceaccounts:get", "serviceaccounts:create"],
    })]);
    let bob = srv.user("bob", &[]);
    let sa = "/api/v1/namespaces/busy/serviceaccounts";
    // A read for a revision far in the future waits (3 s) before its 504: it holds the one
    // read-only slot meanwhile.
    let holder = {
        let bob = bob.clone();
        tokio::spawn(async move {
            bob.get(&format!("{sa}/default?resourceVersion=999999999"))
                .await
                .0
        })
    };
    crate::support::client::eventually(
        std::time::Duration::from_secs(5),
        "the slow read holds the slot",
        || async { srv.handle().app.readonly_inflight.in_flight() == 1 },
    )
    .await;
    let r = bob
        .request(Method::GET, &format!("{sa}/default"), "", &[])
        .await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "{}", r.text());
    assert_eq!(r.headers["retry-after"], "1");
    assert_eq!(r.json()["reason"], "TooManyRequests");
    // Mutating requests have their own limit, and system:masters is never counted.
    let (s, _) = bob.post(sa, json!({"metadata": {"name": "writer"}})).await;
    assert_eq!(s, StatusCode::CREATED);
    assert_eq!(admin.get(&format!("{sa}/default")).await.0, StatusCode::OK);
    // Once the slow read is over, the slot is free again.
    assert_eq!(holder.await.unwrap(), StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(bob.get(&format!("{sa}/default")).await.0, StatusCode::OK);
}
