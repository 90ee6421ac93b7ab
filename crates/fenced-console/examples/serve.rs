//! The console's pages and simulation API on their own, for working on the front end
//! without a lock server: `cargo run -p fenced-console --example serve -- 127.0.0.1:7401`.
//! The live page needs the real server (`fenced server`), which serves all of this too.

#[tokio::main(flavor = "current_thread")]
async fn main() -> std::io::Result<()> {
    let addr = std::env::args().nth(1).unwrap_or_else(|| "127.0.0.1:7401".into());
    let app: axum::Router = fenced_console::pages().merge(fenced_console::api());
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    eprintln!("console on http://{addr}/");
    axum::serve(listener, app).await
}
