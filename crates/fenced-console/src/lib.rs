//! The web console: static pages embedded in the binary (no build step) and the
//! simulation API they call.
//!
//! `pages()` serves `/`, `/live` and `/assets/*` and is meant to stay open like the
//! health endpoints; `api()` serves `POST /v1/sim/runs` and `POST /v1/sim/sweeps` and
//! is merged under the server's `/v1` routes, behind its authentication. `openapi()`
//! describes both, generated from the request types, for the server's `/openapi.json`.

mod assets;
mod doc;
mod sim_api;

pub use assets::pages;
pub use doc::{openapi, openapi_with};
pub use sim_api::{api, api_with, Limits};
