//! The console's files, compiled into the binary.

use axum::extract::Path;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

const FILES: &[(&str, &str, &str)] = &[
    ("lab.html", "text/html; charset=utf-8", include_str!("../assets/lab.html")),
    ("live.html", "text/html; charset=utf-8", include_str!("../assets/live.html")),
    ("console.css", "text/css; charset=utf-8", include_str!("../assets/console.css")),
    ("lab.js", "text/javascript; charset=utf-8", include_str!("../assets/lab.js")),
    ("live.js", "text/javascript; charset=utf-8", include_str!("../assets/live.js")),
    ("common.js", "text/javascript; charset=utf-8", include_str!("../assets/common.js")),
];

/// `/` (the laboratory), `/live` and `/assets/{file}`.
pub fn pages<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route("/", get(|| async { file("lab.html") }))
        .route("/live", get(|| async { file("live.html") }))
        .route("/assets/{name}", get(|Path(name): Path<String>| async move { file(&name) }))
}

fn file(name: &str) -> Response {
    match FILES.iter().find(|(n, _, _)| *n == name) {
        Some((_, mime, body)) => {
            ([(header::CONTENT_TYPE, *mime), (header::CACHE_CONTROL, "no-cache")], *body).into_response()
        }
        None => (
            StatusCode::NOT_FOUND,
            [(header::CONTENT_TYPE, "application/json")],
            r#"{"error":{"code":"not_found","message":"no such console file"}}"#,
        )
            .into_response(),
    }
}
