//! The web console: static pages embedded in the binary (no build step) and the
//! simulation API they call.
//!
//! `pages()` serves `/`, `/live` and `/assets/*` and is meant to stay open like the
//! health endpoints; `api()` serves `POST /v1/sim/runs` and `POST /v1/sim/sweeps` and
//! is merged under the server's `/v1` routes, behind its authentication.

mod assets;
mod sim_api;

pub use assets::pages;
pub use sim_api::{api, Limits};
