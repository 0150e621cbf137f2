//! Who is asking and what they may do: authentication (client certificates, service-account
//! tokens, JWT authenticators, anonymous), authorization (the built-in policy and webhook
//! authorizers) and audit. Uses the layers before it.

pub mod audit;
pub mod authn;
pub mod authorization_config;
pub mod authz;
pub mod jwt;
pub mod state;
pub mod tokens;
