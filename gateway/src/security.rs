//! Who is asking and what they may do: authentication (client certificates, service-account
//! tokens, JWT authenticators, anonymous; in proxy mode the upstream's TokenReview),
//! authorization (the built-in policy and webhook authorizers; in proxy mode impersonation
//! checked upstream) and audit. Uses the layers before it.

pub mod access_review;
pub mod audit;
pub mod authn;
pub mod authorization_config;
pub mod authz;
pub mod impersonation;
pub mod jwt;
pub mod state;
pub mod token_review;
pub mod tokens;
