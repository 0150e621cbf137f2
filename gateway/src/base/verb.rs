//! The Kubernetes verb of a request, computed once from its method and route and carried
//! from there: authorization, audit, admission, limits, metrics and the handlers all read
//! this one value.

use http::Method;

use crate::base::router::Route;

/// What a request does, in Kubernetes' words.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Verb {
    Get,
    List,
    Watch,
    Create,
    Update,
    Patch,
    Delete,
    DeleteCollection,
}

impl Verb {
    /// The verb of a request: GET of a named object is `get`, of a collection `list` (or
    /// `watch` with `watch=true`); DELETE of a collection is `deletecollection`. Requests
    /// outside the resource API (and methods Kubernetes gives no verb) are `get`.
    pub fn of(method: &Method, route: &Route, watch: bool) -> Verb {
        match (method, route) {
            (&Method::GET | &Method::HEAD, Route::Resource(r)) => {
                if watch {
                    Verb::Watch
                } else if r.name.is_some() {
                    Verb::Get
                } else {
                    Verb::List
                }
            }
            (&Method::POST, _) => Verb::Create,
            (&Method::PUT, _) => Verb::Update,
            (&Method::PATCH, _) => Verb::Patch,
            (&Method::DELETE, Route::Resource(r)) if r.name.is_none() => Verb::DeleteCollection,
            (&Method::DELETE, _) => Verb::Delete,
            _ => Verb::Get,
        }
    }

    /// The verb as authorization, audit and `ResourceInfo::verbs` spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            Verb::Get => "get",
            Verb::List => "list",
            Verb::Watch => "watch",
            Verb::Create => "create",
            Verb::Update => "update",
            Verb::Patch => "patch",
            Verb::Delete => "delete",
            Verb::DeleteCollection => "deletecollection",
        }
    }

    /// Whether the request writes (the mutating in-flight pool, admission).
    pub fn is_mutating(self) -> bool {
        matches!(
            self,
            Verb::Create | Verb::Update | Verb::Patch | Verb::Delete | Verb::DeleteCollection
        )
    }

    /// The `verb` label of kube-apiserver's request metrics (`CleanVerb`): upper case,
    /// writes by their HTTP method, an apply patch `APPLY`.
    pub fn metric_label(self, apply: bool) -> &'static str {
        match self {
            Verb::Get => "GET",
            Verb::List => "LIST",
            Verb::Watch => "WATCH",
            Verb::Create => "POST",
            Verb::Update => "PUT",
            Verb::Patch if apply => "APPLY",
            Verb::Patch => "PATCH",
            Verb::Delete | Verb::DeleteCollection => "DELETE",
        }
    }
}

impl std::fmt::Display for Verb {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::router::route;

    #[test]
    fn verbs_follow_kubernetes() {
        let sa = "/api/v1/namespaces/a/serviceaccounts";
        let cases = [
            (Method::GET, sa.to_string(), false, Verb::List),
            (Method::GET, sa.to_string(), true, Verb::Watch),
            (Method::HEAD, format!("{sa}/x"), false, Verb::Get),
            (Method::POST, sa.to_string(), false, Verb::Create),
            (Method::PUT, format!("{sa}/x"), false, Verb::Update),
            (Method::PATCH, format!("{sa}/x"), false, Verb::Patch),
            (Method::DELETE, format!("{sa}/x"), false, Verb::Delete),
            (
                Method::DELETE,
                sa.to_string(),
                false,
                Verb::DeleteCollection,
            ),
            (Method::GET, "/healthz".to_string(), true, Verb::Get),
            (Method::OPTIONS, sa.to_string(), false, Verb::Get),
        ];
        for (method, path, watch, want) in cases {
            assert_eq!(
                Verb::of(&method, &route(&path), watch),
                want,
                "{method} {path}"
            );
        }
        assert_eq!(Verb::DeleteCollection.as_str(), "deletecollection");
        assert_eq!(Verb::Patch.metric_label(true), "APPLY");
        assert!(Verb::Delete.is_mutating() && !Verb::Watch.is_mutating());
    }
}
