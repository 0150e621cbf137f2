//! Content negotiation: which representation a client accepts (`Accept`, in preference
//! order) and which one a request body is in (`Content-Type`).

use http::HeaderMap;
use svc_core::ApiError;
use svc_core::watch::FrameFormat;

use crate::base::features::{Feature, FeatureGates};
use svc_core::codec::{MEDIA_TYPE_KUBERNETES_PROTOBUF, MEDIA_TYPE_PROTOBUF};
pub use svc_core::watch::MetaGroup;

/// A representation the server reads and writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Json,
    Yaml,
    /// Protobuf, answered under the media type name the client used (ours or Kubernetes').
    Protobuf(&'static str),
    /// CBOR (`application/cbor`, `application/cbor-seq` for watches): behind the alpha
    /// `CBORServingAndStorage` gate.
    Cbor,
    /// `application/json;as=Table;g=meta.svc.io;v=v1`.
    Table,
    /// `application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1` (an object or a watch)
    /// or `as=PartialObjectMetadataList` (a list): metadata alone, in the meta group the
    /// client named. Kubernetes' group is accepted because client-go's metadata client (the
    /// garbage collector's, the namespace controller's) asks for it and decodes only it.
    PartialMetadata {
        group: MetaGroup,
        list: bool,
    },
}

impl Format {
    /// The frames a watch is written in for this format, in both modes; 406 for the formats a
    /// watch stream has none of (a metadata list, YAML, Tables).
    pub fn watch_frames(&self) -> Result<FrameFormat, ApiError> {
        match *self {
            Format::Json => Ok(FrameFormat::Json),
            Format::Protobuf(_) => Ok(FrameFormat::Protobuf),
            Format::Cbor => Ok(FrameFormat::CborSeq),
            Format::PartialMetadata { group, list: false } => {
                Ok(FrameFormat::PartialMetadata(group))
            }
            Format::PartialMetadata { list: true, .. } => Err(ApiError::NotAcceptable(
                "you requested PartialObjectMetadataList, but a watch event's object is not a list"
                    .into(),
            )),
            Format::Yaml | Format::Table => Err(ApiError::NotAcceptable(
                "watch streams are served as JSON, protobuf or CBOR sequences".into(),
            )),
        }
    }

    pub fn content_type(self) -> &'static str {
        match self {
            Format::Json | Format::Table | Format::PartialMetadata { .. } => "application/json",
            Format::Yaml => "application/yaml",
            Format::Protobuf(name) => name,
            Format::Cbor => "application/cbor",
        }
    }
}

struct MediaRange<'a> {
    essence: String,
    params: Vec<(&'a str, &'a str)>,
    q: f32,
}

impl MediaRange<'_> {
    fn param(&self, name: &str) -> Option<&str> {
        self.params
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| *v)
    }
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
                    // Not a number (`q=nan`) counts as 0, so the order below is total.
                    q = v.parse().ok().filter(|q: &f32| !q.is_nan()).unwrap_or(0.0);
                } else {
                    params.push((k, v));
                }
            }
            Some(MediaRange { essence, params, q })
        })
        .collect();
    // Highest q first; among equals, the order the client wrote (a stable sort keeps it).
    out.sort_by(|a, b| b.q.total_cmp(&a.q));
    out
}

/// The format for a response body, or 406 when nothing the client accepts is served.
/// `watch` picks among the streaming formats (JSON, protobuf, CBOR sequences).
pub fn response_format(
    headers: &HeaderMap,
    gates: &FeatureGates,
    watch: bool,
) -> Result<Format, ApiError> {
    let cbor = gates.enabled(Feature::CBORServingAndStorage);
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
        // Alternative representations are asked for with `as=`: Table of our meta group (not
        // on watches), and partial metadata in either meta group; others (Kubernetes'
        // meta.k8s.io Table) fall through to the next range, as the spec allows.
        if let Some(as_) = r.param("as") {
            let json = matches!(
                r.essence.as_str(),
                "application/json" | "application/*" | "*/*"
            );
            let group = match r.param("g") {
                Some("meta.k8s.io") => Some(MetaGroup::K8s),
                Some("meta.svc.io") => Some(MetaGroup::Svc),
                _ => None,
            };
            if json && r.param("v") == Some("v1") {
                match (as_, group) {
                    ("Table", Some(MetaGroup::Svc)) if !watch => return Ok(Format::Table),
                    ("PartialObjectMetadata" | "PartialObjectMetadataList", Some(group)) => {
                        return Ok(Format::PartialMetadata {
                            group,
                            list: as_ == "PartialObjectMetadataList",
                        });
                    }
                    _ => {}
                }
            }
            continue;
        }
        match r.essence.as_str() {
            "application/json" | "application/*" | "*/*" => return Ok(Format::Json),
            "application/yaml" if !watch => return Ok(Format::Yaml),
            MEDIA_TYPE_PROTOBUF => return Ok(Format::Protobuf(MEDIA_TYPE_PROTOBUF)),
            MEDIA_TYPE_KUBERNETES_PROTOBUF => {
                return Ok(Format::Protobuf(MEDIA_TYPE_KUBERNETES_PROTOBUF));
            }
            "application/cbor" if cbor && !watch => return Ok(Format::Cbor),
            "application/cbor-seq" | "application/cbor" if cbor && watch => {
                return Ok(Format::Cbor);
            }
            _ => {}
        }
    }
    let mut offered = vec!["application/json"];
    if !watch {
        offered.extend([
            "application/yaml",
            "application/json;as=Table;g=meta.svc.io;v=v1",
        ]);
    }
    offered.extend([MEDIA_TYPE_PROTOBUF, MEDIA_TYPE_KUBERNETES_PROTOBUF]);
    if cbor {
        offered.push(if watch {
            "application/cbor-seq"
        } else {
            "application/cbor"
        });
    }
    Err(ApiError::NotAcceptable(format!(
        "only the following media types are accepted: {} (requested {accept:?})",
        offered.join(", ")
    )))
}

/// The media type of a `Content-Type` without its parameters, lower case.
pub fn essence(content_type: &str) -> String {
    content_type
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase()
}

/// The format a body's `Content-Type` names, whatever the gates allow (JSON when unstated);
/// None when it names no format this server reads.
pub fn body_format(content_type: &str) -> Option<Format> {
    match essence(content_type).as_str() {
        "" | "application/json" | "*/*" => Some(Format::Json),
        "application/yaml" => Some(Format::Yaml),
        MEDIA_TYPE_PROTOBUF => Some(Format::Protobuf(MEDIA_TYPE_PROTOBUF)),
        MEDIA_TYPE_KUBERNETES_PROTOBUF => Some(Format::Protobuf(MEDIA_TYPE_KUBERNETES_PROTOBUF)),
        "application/cbor" => Some(Format::Cbor),
        _ => None,
    }
}

/// The format of a request body; JSON when unstated, 415 when unsupported.
pub fn request_format(headers: &HeaderMap, gates: &FeatureGates) -> Result<Format, ApiError> {
    let Some(ct) = headers.get(http::header::CONTENT_TYPE) else {
        return Ok(Format::Json);
    };
    let ct = ct.to_str().unwrap_or_default();
    let cbor = gates.enabled(Feature::CBORServingAndStorage);
    match body_format(ct) {
        Some(Format::Cbor) if !cbor => Err(unsupported_body(ct, cbor)),
        Some(format) => Ok(format),
        None => Err(unsupported_body(ct, cbor)),
    }
}

fn unsupported_body(ct: &str, cbor: bool) -> ApiError {
    ApiError::UnsupportedMediaType(format!(
        "the body of the request was in an unknown format - accepted media types include: \
         application/json, application/yaml, {MEDIA_TYPE_PROTOBUF}, \
         {MEDIA_TYPE_KUBERNETES_PROTOBUF}{} (got {ct:?})",
        if cbor { ", application/cbor" } else { "" }
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn accept(v: &str) -> Result<Format, ApiError> {
        let mut h = HeaderMap::new();
        h.insert(http::header::ACCEPT, v.parse().unwrap());
        response_format(&h, &FeatureGates::default(), false)
    }

    #[test]
    fn quality_values_that_are_not_numbers_sort_as_zero() {
        // Long enough for the sort to check its order is total: NaN must not break it.
        let mut list: Vec<String> = (0..40)
            .map(|i| match i % 4 {
                0 => "text/plain;q=nan".to_string(),
                1 => format!("application/xml;q=0.{i}"),
                2 => "text/html;q=NaN".to_string(),
                _ => "image/png;q=inf".to_string(),
            })
            .collect();
        list.push("application/json;q=0.9".into());
        assert_eq!(accept(&list.join(", ")).unwrap(), Format::Json);
        assert_eq!(accept("application/json;q=nan").unwrap_err().code(), 406);
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
        assert_eq!(accept("application/yaml").unwrap(), Format::Yaml);
        assert_eq!(
            accept("application/json;as=Table;g=meta.svc.io;v=v1").unwrap(),
            Format::Table
        );
        assert_eq!(
            accept("application/json;as=Table;g=meta.k8s.io;v=v1")
                .unwrap_err()
                .code(),
            406
        );
        // Partial metadata in either meta group; client-go's metadata client's header picks
        // the JSON one (protobuf is not offered for it).
        assert_eq!(
            accept(
                "application/vnd.kubernetes.protobuf;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,\
                 application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json"
            )
            .unwrap(),
            Format::PartialMetadata {
                group: MetaGroup::K8s,
                list: true
            }
        );
        assert_eq!(
            accept("application/json;as=PartialObjectMetadata;g=meta.svc.io;v=v1").unwrap(),
            Format::PartialMetadata {
                group: MetaGroup::Svc,
                list: false
            }
        );
        assert_eq!(
            accept("application/json;as=PartialObjectMetadata;g=example.com;v=v1")
                .unwrap_err()
                .code(),
            406
        );
        // CBOR only behind its gate.
        assert_eq!(accept("application/cbor").unwrap_err().code(), 406);
        let mut h = HeaderMap::new();
        h.insert(
            http::header::ACCEPT,
            "application/cbor-seq".parse().unwrap(),
        );
        let gates = FeatureGates::parse("CBORServingAndStorage=true").unwrap();
        assert_eq!(response_format(&h, &gates, true).unwrap(), Format::Cbor);
        // No YAML or Table watch streams.
        h.insert(http::header::ACCEPT, "application/yaml".parse().unwrap());
        assert_eq!(response_format(&h, &gates, true).unwrap_err().code(), 406);
    }

    #[test]
    fn content_types() {
        let mut h = HeaderMap::new();
        h.insert(
            http::header::CONTENT_TYPE,
            "application/json; charset=utf-8".parse().unwrap(),
        );
        let gates = FeatureGates::default();
        assert_eq!(request_format(&h, &gates).unwrap(), Format::Json);
        h.insert(
            http::header::CONTENT_TYPE,
            "application/yaml".parse().unwrap(),
        );
        assert_eq!(request_format(&h, &gates).unwrap(), Format::Yaml);
        h.insert(
            http::header::CONTENT_TYPE,
            "application/cbor".parse().unwrap(),
        );
        assert_eq!(request_format(&h, &gates).unwrap_err().code(), 415);
        h.insert(http::header::CONTENT_TYPE, "text/plain".parse().unwrap());
        assert_eq!(request_format(&h, &gates).unwrap_err().code(), 415);
    }
}
