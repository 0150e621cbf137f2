//! Content negotiation: which representation a client accepts (`Accept`, in preference
//! order) and which one a request body is in (`Content-Type`).

use http::HeaderMap;
use svc_core::ApiError;
use svc_core::codec::{MEDIA_TYPE_KUBERNETES_PROTOBUF, MEDIA_TYPE_PROTOBUF};

/// A representation the server reads and writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Json,
    /// Protobuf, answered under the media type name the client used (ours or Kubernetes').
    Protobuf(&'static str),
}

impl Format {
    pub fn content_type(self) -> &'static str {
        match self {
            Format::Json => "application/json",
            Format::Protobuf(name) => name,
        }
    }
}

struct MediaRange<'a> {
    essence: String,
    params: Vec<(&'a str, &'a str)>,
    q: f32,
}

fn parse_accept(accept: &str) -> Vec<MediaRange<'_>> {
    let mut out: Vec<MediaRange<'_>> = accept
        .split(',')
        .filter_map(|part| {
            let mut it = part.split(';').map(str::trim);
            let essence = it.next()?.to_ascii_lowercase();
            if essence.is_empty() {
                return None;
            }
            let mut q = 1.0;
            let mut params = Vec::new();
            for p in it {
                let (k, v) = p.split_once('=').unwrap_or((p, ""));
                let (k, v) = (k.trim(), v.trim().trim_matches('"'));
                if k.eq_ignore_ascii_case("q") {
                    q = v.parse().unwrap_or(0.0);
                } else {
                    params.push((k, v));
                }
            }
            Some(MediaRange { essence, params, q })
        })
        .collect();
    // Highest q first; among equals, the order the client wrote (a stable sort keeps it).
    out.sort_by(|a, b| b.q.partial_cmp(&a.q).unwrap_or(std::cmp::Ordering::Equal));
    out
}

/// The format for a response body, or 406 when nothing the client accepts is served.
pub fn response_format(headers: &HeaderMap) -> Result<Format, ApiError> {
    let Some(accept) = headers.get(http::header::ACCEPT) else {
        return Ok(Format::Json);
    };
    let accept = accept
        .to_str()
        .map_err(|_| ApiError::NotAcceptable("the Accept header is not valid text".into()))?;
    if accept.trim().is_empty() {
        return Ok(Format::Json);
    }
    for r in parse_accept(accept) {
        if r.q <= 0.0 {
            continue;
        }
        // Alternative representations (Table, PartialObjectMetadata) are asked for with `as=`;
        // a range carrying it is only acceptable when that representation is served.
        if r.params.iter().any(|(k, _)| k.eq_ignore_ascii_case("as")) {
            continue;
        }
        match r.essence.as_str() {
            "application/json" | "application/*" | "*/*" => return Ok(Format::Json),
            MEDIA_TYPE_PROTOBUF => return Ok(Format::Protobuf(MEDIA_TYPE_PROTOBUF)),
            MEDIA_TYPE_KUBERNETES_PROTOBUF => {
                return Ok(Format::Protobuf(MEDIA_TYPE_KUBERNETES_PROTOBUF));
            }
            _ => {}
        }
    }
    Err(ApiError::NotAcceptable(format!(
        "only the following media types are accepted: application/json, {MEDIA_TYPE_PROTOBUF}, \
         {MEDIA_TYPE_KUBERNETES_PROTOBUF} (requested {accept:?})"
    )))
}

/// The format of a request body; JSON when unstated, 415 when unsupported.
pub fn request_format(headers: &HeaderMap) -> Result<Format, ApiError> {
    let Some(ct) = headers.get(http::header::CONTENT_TYPE) else {
        return Ok(Format::Json);
    };
    let ct = ct.to_str().unwrap_or_default();
    let essence = ct
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    match essence.as_str() {
        "" | "application/json" | "*/*" => Ok(Format::Json),
        MEDIA_TYPE_PROTOBUF => Ok(Format::Protobuf(MEDIA_TYPE_PROTOBUF)),
        MEDIA_TYPE_KUBERNETES_PROTOBUF => Ok(Format::Protobuf(MEDIA_TYPE_KUBERNETES_PROTOBUF)),
        _ => Err(ApiError::UnsupportedMediaType(format!(
            "the body of the request was in an unknown format - accepted media types include: \
             application/json, {MEDIA_TYPE_PROTOBUF}, {MEDIA_TYPE_KUBERNETES_PROTOBUF} (got {ct:?})"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn accept(v: &str) -> Result<Format, ApiError> {
        let mut h = HeaderMap::new();
        h.insert(http::header::ACCEPT, v.parse().unwrap());
        response_format(&h)
    }

    #[test]
    fn accept_lists_fall_back_in_order() {
        assert_eq!(accept("application/json").unwrap(), Format::Json);
        assert_eq!(
            accept("application/vnd.kubernetes.protobuf, application/json").unwrap(),
            Format::Protobuf(MEDIA_TYPE_KUBERNETES_PROTOBUF)
        );
        assert_eq!(
            accept("application/vnd.svc.protobuf").unwrap(),
            Format::Protobuf(MEDIA_TYPE_PROTOBUF)
        );
        assert_eq!(
            accept("application/json;as=Table;v=v1;g=meta.k8s.io,application/json").unwrap(),
            Format::Json
        );
        assert_eq!(accept("application/xml, */*;q=0.5").unwrap(), Format::Json);
        assert_eq!(
            accept("application/json;q=0.5, application/vnd.svc.protobuf").unwrap(),
            Format::Protobuf(MEDIA_TYPE_PROTOBUF)
        );
        assert_eq!(accept("application/xml").unwrap_err().code(), 406);
        assert_eq!(accept("application/json;q=0").unwrap_err().code(), 406);
    }

    #[test]
    fn content_types() {
        let mut h = HeaderMap::new();
        h.insert(
            http::header::CONTENT_TYPE,
            "application/json; charset=utf-8".parse().unwrap(),
        );
        assert_eq!(request_format(&h).unwrap(), Format::Json);
        h.insert(http::header::CONTENT_TYPE, "text/plain".parse().unwrap());
        assert_eq!(request_format(&h).unwrap_err().code(), 415);
    }
}
