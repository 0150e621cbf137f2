//! The HTTP face of the registry: content negotiation, responses and errors as `Status`, the
//! in-flight limits, the REST handlers, discovery, OpenAPI and health; in proxy mode, the
//! pass-through to the upstream. Uses the layers before it; knows nothing of listeners or
//! connections.

pub mod api;
pub mod cached;
pub mod discovery;
pub mod health;
pub mod limits;
pub mod negotiate;
pub mod openapi;
pub mod openapi_v2;
pub mod proxy;
pub mod respond;
pub mod rest;
pub mod stream;
